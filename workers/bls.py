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
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from weir import names, stages, wire
from weir.errors import DeadlineExceeded, NotFound, Unavailable, WeirError
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

    async def acall(self, call: ModelCall) -> InferReply:
        """The call itself, in the worker's event loop; a failure as an error reply."""
        request_id = f"{self._prefix}{next(self._ids)}"
        try:
            return await self._call(request_id, call)
        except WeirError as exc:
            return InferReply(request_id, call.model, call.version, error=(exc.kind, exc.message))
        except RedisError as exc:
            failure = Unavailable(f"cannot call model '{call.model}': {exc}")
            error = (failure.kind, failure.message)
            return InferReply(request_id, call.model, call.version, error=error)

    async def _call(self, request_id: str, call: ModelCall) -> InferReply:
        if self.repository is None:
            raise Unavailable("this worker cannot call other models yet: it is starting")
        entry, version = self.repository.resolve(call.model, call.version or None)
        if entry.config.is_ensemble:
            raise NotFound(f"model '{call.model}' is a pipeline: call its steps")
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
        future: asyncio.Future[InferReply] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        try:
            raise_errors(await self.link.call(stages.forward(request, batch)))
            try:
                return await asyncio.wait_for(future, call.timeout_s)
            except TimeoutError:
                raise DeadlineExceeded(
                    f"{DeadlineExceeded.TRITON_TEXT}: model '{call.model}' did not answer "
                    f"within {call.timeout_s:g} s"
                ) from None
        finally:
            self.waiting.pop(request_id, None)

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
            future = self.waiting.get(reply.id)
            if reply.part is None and future is not None and not future.done():
                future.set_result(reply)

    async def close(self) -> None:
        try:
            await self.link.call(("DEL", self.stream))
        except RedisError:
            logger.warning("could not delete the reply stream %s", self.stream)
        await self.reply_link.close()


# The worker's client, for the Triton Python models it runs (one worker per process).
CLIENT: BlsClient | None = None
