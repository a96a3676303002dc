"""Calls from a model to other models (Triton's BLS): requests a worker sends into the mesh.

A Triton Python model may call another model from ``execute``:
``pb_utils.InferenceRequest(model_name=..., inputs=..., requested_output_names=...).exec()``
(or ``await ...async_exec()``). The worker queues such a request on the called model's
request stream as a pipeline step is queued (past the queue limit: the caller was admitted),
with its own reply stream as ``reply_to``; the batcher batches it with the model's other
requests, any worker serving that model runs it, and the reply comes back to this worker,
whose reader hands it to the waiting call. The call's deadline is the calling batch's
(``WEIR_GATEWAY_REQUEST_TIMEOUT_S``' default outside one, or the call's ``timeout``).

What a call cannot be answered with (an unknown model or version, a reply past the deadline,
Redis away) comes back as the response's error, as Triton's ``exec()`` gives it. Calls made
by a worker that dies are not queued again: the calling batch runs again on another worker,
which calls again.

A decoupled call (``exec(decoupled=True)``) is a :class:`CallStream`: the called model's
responses, each as it comes (the parts of its answer, :mod:`workers.parts`), then its answer
(empty for a Triton decoupled model, whose responses are all parts). A part sent again (the
called batch ran again) is passed on only past the last passed on. ``cancel()`` ends the
stream and tells the mesh nobody waits for the call (the called model's
``is_cancelled()``). A decoupled model called without ``decoupled=True`` is an error, as in
Triton.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from weir import cancels, names, stages, wire
from weir.errors import DeadlineExceeded, NotFound, Unavailable, Unsupported, WeirError
from weir.redis_io.link import HotLink, raise_errors
from weir.redis_io.links import open_link
from weir.repository import Repository
from weir.settings import WorkerSettings
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest

logger = logging.getLogger(__name__)

READ_COUNT = 100  # replies taken per read
ENSURE_EVERY_S = 5.0  # how often the reply stream is made again (a Redis that restarted)


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One call: the model (and version; empty: the latest), inputs, outputs, deadline."""

    model: str
    version: str
    inputs: dict[str, Tensor]
    outputs: list[str]
    timeout_s: float


class CallStream:
    """The replies to one decoupled call as they come, for the calling model's thread."""

    def __init__(self, client: BlsClient, request_id: str, call: ModelCall) -> None:
        self.client = client
        self.id = request_id
        self.call = call
        self.deadline_s = time.monotonic() + call.timeout_s
        self.replies: queue.SimpleQueue[InferReply] = queue.SimpleQueue()
        self.next_part = 0  # parts below it were passed on (the event loop's count)
        self.ended = False  # the model's thread's: the answer, an error or cancel() was seen
        self.sent_to: tuple[str, str] | None = None  # the model and version it was sent to

    def deliver(self, reply: InferReply) -> None:
        """A reply read for this call (in the event loop)."""
        if reply.part is not None:
            if reply.part < self.next_part:
                return  # sent again by a run of the batch after the first
            self.next_part = reply.part + 1
        self.replies.put(reply)

    def next(self) -> InferReply | None:
        """The next reply, waited for until the call's deadline; None after the answer."""
        if self.ended:
            return None
        try:
            reply = self.replies.get(timeout=max(self.deadline_s - time.monotonic(), 0.0))
        except queue.Empty:
            error = self.client.late(self.call)
            reply = InferReply(self.id, self.call.model, self.call.version, error=error)
        if reply.part is None:
            self._end()
        return reply

    def cancel(self) -> None:
        """Stop reading, and tell the mesh nobody waits for the call any more."""
        if not self.ended:
            self._end()
            self.client.cancel(self)

    def _end(self) -> None:
        self.ended = True
        self.client.forget(self.id)


class BlsClient:
    """One worker's calls to other models, and the reader of their replies."""

    def __init__(self, settings: WorkerSettings, worker_id: str, link: HotLink) -> None:
        self.link = link  # sends, on the worker's link
        self.reply_link = open_link(settings.redis_url, settings.redis_timeout_s)
        self.stream = names.call_reply_stream(worker_id)
        self.block_ms = settings.block_ms
        self.default_timeout_s = 60.0
        self.repository: Repository | None = None  # the worker's, as it follows it
        self.loop: asyncio.AbstractEventLoop | None = None
        self.waiting: dict[str, asyncio.Future[InferReply]] = {}
        self.streams: dict[str, CallStream] = {}  # decoupled calls, by request id
        self._notices: set[asyncio.Task[None]] = set()  # cancel notices being written
        self._ids = itertools.count()
        self._prefix = f"bls-{worker_id}-"

    def call(self, call: ModelCall) -> InferReply:
        """Make ``call`` from a model's thread, and wait for its reply (or an error one)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            error = Unavailable("this worker cannot call other models: it is not running")
            return InferReply("", call.model, call.version, error=(error.kind, error.message))
        running = asyncio.run_coroutine_threadsafe(self.acall(call), loop)
        return running.result()  # acall gives up by itself at the deadline

    def new_stream(self, call: ModelCall) -> CallStream:
        """A decoupled call's stream, not sent yet (:meth:`astream` sends it)."""
        return CallStream(self, f"{self._prefix}{next(self._ids)}", call)

    def call_decoupled(self, call: ModelCall) -> CallStream:
        """Make a decoupled ``call`` from a model's thread: its replies, as they come."""
        stream = self.new_stream(call)
        loop = self.loop
        if loop is None or loop.is_closed():
            error = Unavailable("this worker cannot call other models: it is not running")
            stream.deliver(InferReply(stream.id, call.model, call.version, error=error.pair))
            return stream
        asyncio.run_coroutine_threadsafe(self.astream(stream), loop).result()
        return stream

    async def astream(self, stream: CallStream) -> None:
        """Send a decoupled call, in the worker's event loop; a failure as its answer."""
        call = stream.call
        self.streams[stream.id] = stream
        try:
            stream.sent_to = await self._send(stream.id, call, decoupled=True)
        except (WeirError, RedisError) as exc:
            reply = InferReply(stream.id, call.model, call.version, error=_error(call, exc))
            stream.deliver(reply)

    async def acall(self, call: ModelCall) -> InferReply:
        """The call itself, in the worker's event loop; a failure as an error reply."""
        request_id = f"{self._prefix}{next(self._ids)}"
        try:
            return await self._call(request_id, call)
        except (WeirError, RedisError) as exc:
            return InferReply(request_id, call.model, call.version, error=_error(call, exc))

    def late(self, call: ModelCall) -> tuple[str, str]:
        """The error of a call that met its deadline."""
        return DeadlineExceeded(
            f"{DeadlineExceeded.TRITON_TEXT}: model '{call.model}' did not answer "
            f"within {call.timeout_s:g} s"
        ).pair

    def forget(self, request_id: str) -> None:
        """A decoupled call has ended: later replies to it are dropped (any thread)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.streams.pop, request_id, None)

    def cancel(self, stream: CallStream) -> None:
        """Tell the mesh nobody waits for ``stream``'s call (any thread; best effort)."""
        if stream.sent_to is None or self.loop is None or self.loop.is_closed():
            return
        until_ms = int((time.time() + stream.call.timeout_s) * 1000)
        command = cancels.notice(names.cancel_stream(*stream.sent_to), [stream.id], until_ms)
        self.loop.call_soon_threadsafe(self._send_notice, command)

    def _send_notice(self, command: Any) -> None:
        """In the event loop: write the notice in a task held until it ends."""
        task = asyncio.create_task(self._notice(command))
        self._notices.add(task)
        task.add_done_callback(self._notices.discard)

    async def _notice(self, command: Any) -> None:
        try:
            await self.link.call(command)
        except RedisError as exc:
            logger.warning("could not cancel a call to another model: %s", exc)

    async def _call(self, request_id: str, call: ModelCall) -> InferReply:
        future: asyncio.Future[InferReply] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        try:
            await self._send(request_id, call, decoupled=False)
            try:
                return await asyncio.wait_for(future, call.timeout_s)
            except TimeoutError:
                raise DeadlineExceeded(self.late(call)[1]) from None
        finally:
            self.waiting.pop(request_id, None)

    async def _send(self, request_id: str, call: ModelCall, decoupled: bool) -> tuple[str, str]:
        """Queue the call's request; the model and version it went to."""
        if self.repository is None:
            raise Unavailable("this worker cannot call other models yet: it is starting")
        entry, version = self.repository.resolve(call.model, call.version or None)
        if entry.config.is_ensemble:
            raise NotFound(f"model '{call.model}' is a pipeline: call its steps")
        if entry.config.decoupled and not decoupled:
            raise Unsupported(
                f"model '{call.model}' is decoupled: call it with exec(decoupled=True) "
                "or async_exec(decoupled=True)"
            )
        inputs = call.inputs
        rows = next(iter(inputs.values())).shape[0] if inputs else 1
        batch = rows if entry.config.max_batch_size > 0 else 1
        request = InferRequest(
            id=request_id,
            model=entry.name,
            version=version,
            inputs=inputs,
            reply_to=self.stream,
            deadline_ms=int((time.time() + call.timeout_s) * 1000),
            outputs=call.outputs,
        )
        raise_errors(await self.link.call(stages.forward(request, batch)))
        return entry.name, version

    async def run(self, should_exit: asyncio.Event) -> None:
        """Read the replies to this worker's calls, for as long as it runs."""
        self.loop = asyncio.get_running_loop()
        last_id, ensured_s = b"0-0", -ENSURE_EVERY_S
        while not should_exit.is_set():
            try:
                if time.monotonic() - ensured_s >= ENSURE_EVERY_S:
                    raise_errors(await self.reply_link.call(stages.ensure_stream(self.stream)))
                    ensured_s = time.monotonic()
                last_id = await self._read(last_id)
            except RedisError as exc:
                logger.warning("reading the replies to model calls failed, retrying: %s", exc)
                ensured_s = -ENSURE_EVERY_S
                await asyncio.sleep(1.0)

    async def _read(self, last_id: bytes) -> bytes:
        block = ("BLOCK", self.block_ms)
        _, result = raise_errors(
            await self.reply_link.call(
                ("XTRIM", self.stream, "MINID", last_id),
                ("XREAD", "COUNT", READ_COUNT, *block, "STREAMS", self.stream, last_id),
                block_s=self.block_ms / 1000,
            )
        )
        for _, entries in result or []:
            for entry_id, fields in entries:
                last_id = entry_id
                self._resolve(fields)
        return last_id

    def _resolve(self, fields: list[Any]) -> None:
        try:
            payloads = wire.decode_batch(wire.flat_field(fields, wire.PAYLOAD))
        except (KeyError, ValueError):
            return  # the stream's creation entry, or nothing of a reply
        for payload in payloads:
            try:
                reply = InferReply.decode(payload)
            except Exception as exc:
                logger.error("skipped a malformed reply to a model call: %s", exc)
                continue
            stream = self.streams.get(reply.id)
            if stream is not None:
                stream.deliver(reply)
                continue
            future = self.waiting.get(reply.id)
            if reply.part is None and future is not None and not future.done():
                future.set_result(reply)

    async def close(self) -> None:
        try:
            await self.link.call(("DEL", self.stream))
        except RedisError:
            logger.warning("could not delete the reply stream %s", self.stream)
        await self.reply_link.close()


def _error(call: ModelCall, exc: Exception) -> tuple[str, str]:
    if isinstance(exc, WeirError):
        return exc.pair
    return Unavailable(f"cannot call model '{call.model}': {exc}").pair


# The worker's client, for the Triton Python models it runs (one worker per process).
CLIENT: BlsClient | None = None
