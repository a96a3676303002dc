"""The gateway's side of the mesh: put a request on its stream, await its reply.

Each gateway process owns one reply stream. One reader task reads it (many entries per
``XREAD``) and resolves the waiting request by id; a reply nobody waits for any more (its
deadline passed, or a redelivered batch answered it twice) is dropped, so each request is
answered exactly once. Each read also trims what the previous read consumed, in the same
round trip. A reply with a part number (a part of a streamed answer) goes to the request's
part listener, when it has one (gateway.parts), and leaves the request waiting.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.admission import ADMITTED, LEVEL_FULL, Admission, refusal
from gateway.cancels import Canceller
from gateway.catalog import Catalog
from gateway.codec import InferBody, check_parameter_size
from gateway.deadline import Deadline
from gateway.parts import PartFilter, PartListener
from gateway.resubmission import Accepted, Resubmitter
from gateway.validation import (
    model_parameters,
    priority_level,
    queue_fields,
    request_timeout_s,
    sequence_of,
)
from pipelines.route import Route, Router
from weir import names, wire
from weir.control.mode import ControlMode
from weir.errors import DeadlineExceeded, ServerError, Unavailable, WeirError
from weir.redis_io.link import raise_errors
from weir.redis_io.links import open_link
from weir.redis_io.retry import RetryWait
from weir.repository import ModelEntry
from weir.settings import GatewaySettings
from weir.stages import ENSURE_SCRIPT
from weir.stats import Stamp
from weir.wire import InferReply, InferRequest

logger = logging.getLogger(__name__)

# How often a gateway on a Redis Cluster asks which primary serves each slot, so that a
# failover of a primary it sends nothing to any more is noticed too.
TOPOLOGY_CHECK_S = 1.0


class MeshClient:
    """Sends requests into the mesh and matches the replies that come back."""

    def __init__(self, redis: Redis, settings: GatewaySettings, catalog: Catalog) -> None:
        self.redis = redis
        self.settings = settings
        self.catalog = catalog
        self.gateway_id = uuid.uuid4().hex[:16]
        self.reply_stream = names.reply_stream(self.gateway_id)
        self.waiting: dict[str, asyncio.Future[InferReply]] = {}
        self.streaming: dict[str, PartFilter] = {}  # requests that take parts, by id
        self.inflight_bytes = 0  # the input bytes of the requests in self.waiting
        # The hot path's own connections: one shared by admissions, one for the blocking
        # reply reads (see weir.redis_io.link).
        check_open = settings.model_control_mode is not ControlMode.NONE
        self.admission = Admission(
            open_link(settings.redis_url, settings.redis_timeout_s),
            check_open,
            settings.admission_memory_fraction,
        )
        # It records the server it reads from: another one may not hold what this gateway
        # queued (gateway.resubmission).
        self.reply_link = open_link(settings.redis_url, settings.redis_timeout_s, identify=True)
        self.resubmitter = Resubmitter(self._resend, self._fail)
        self._topology_checked_s = time.monotonic()
        self._ids = itertools.count()
        self.canceller = Canceller(self.admission.link)
        # Why the last reply read failed; None once one succeeds (see read_replies).
        self.reader_failure: str | None = None

    @property
    def router(self) -> Router:
        return self.catalog.router

    async def infer(
        self,
        entry: ModelEntry,
        version: str,
        body: InferBody,
        batch: int,
        on_part: PartListener | None = None,
    ) -> InferReply:
        """Queue one request and wait for its reply, at most until its deadline.

        ``on_part`` gets each part of a streamed answer first (gateway.parts).
        """
        settings = self.settings
        check_parameter_size(
            body.parameters, settings.max_parameters, settings.max_parameters_bytes
        )
        self.catalog.check_ready(entry.name, version)
        size = sum(len(tensor.data) for tensor in body.inputs.values())
        self._check_budget(size)
        level = priority_level(entry.config, body)
        timeout_s = request_timeout_s(self.settings.request_timeout_s, entry.config, body, level)
        request = self._request(entry, version, body, timeout_s)
        request.sequence = sequence_of(self.router.scheduled_config(entry.config), body, batch)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferReply] = loop.create_future()
        self.waiting[request.id] = future
        if on_part is not None:
            self.streaming[request.id] = PartFilter(on_part)
        self.inflight_bytes += size
        # The deadline covers queueing too: a Redis that stops answering cannot hold a
        # request past it.
        deadline = Deadline(loop, timeout_s)
        try:
            if entry.config.is_ensemble:
                await self._start_route(entry, version, request, body)
            else:
                await self._send(entry, request, batch, level)
            accepted = Accepted(entry, version, request, body, batch, level)
            self.resubmitter.accepted[request.id] = accepted
            return await future
        except asyncio.CancelledError:
            if deadline.absorb():
                raise DeadlineExceeded(
                    f"{DeadlineExceeded.TRITON_TEXT}: model '{entry.name}' version "
                    f"'{version}' did not answer within {timeout_s:g} s"
                ) from None
            # The client left (HTTP disconnect, gRPC cancel): the mesh need not run it.
            self._cancel(entry, version, request)
            raise
        finally:
            deadline.cancel()
            self.waiting.pop(request.id, None)
            if on_part is not None:
                self.streaming.pop(request.id, None)
            self.resubmitter.accepted.pop(request.id, None)
            self.inflight_bytes -= size

    def answer_failed_loads(self) -> None:
        """Answer at once the accepted requests of versions that failed to load.

        Queued before the failure was seen, they would wait for nobody; a later load skips them.
        """
        if not self.catalog.failed:
            return
        for accepted in list(self.resubmitter.accepted.values()):
            entry, version, request = accepted.entry, accepted.version, accepted.request
            error = self.catalog.not_ready(entry.name, version)
            if error is not None:
                self._cancel(entry, version, request)
                self._fail(request.id, error)

    def _cancel(self, entry: ModelEntry, version: str, request: InferRequest) -> None:
        if entry.config.is_ensemble:
            steps = self.router.pipelines[entry.name].steps
            streams = [names.cancel_stream(step.model, step.version) for step in steps]
        else:
            streams = [names.cancel_stream(entry.name, version)]
        self.canceller.cancel(streams, request.id, request.deadline_ms)

    def _check_budget(self, size: int) -> None:
        """503 past the gateway's in-flight budget (a request alone is always taken)."""
        settings = self.settings
        if len(self.waiting) >= settings.max_inflight_requests:
            raise Unavailable(
                f"the gateway has {len(self.waiting)} requests in flight, its most "
                "(WEIR_GATEWAY_MAX_INFLIGHT_REQUESTS); retry later",
                settings.retry_after_s,
            )
        if self.inflight_bytes and self.inflight_bytes + size > settings.max_inflight_bytes:
            raise Unavailable(
                f"the gateway holds {self.inflight_bytes} bytes of requests in flight; "
                f"{size} more would pass its most (WEIR_GATEWAY_MAX_INFLIGHT_BYTES); retry later",
                settings.retry_after_s,
            )

    async def _start_route(
        self,
        entry: ModelEntry,
        version: str,
        request: InferRequest,
        body: InferBody,
        readmit: bool = False,
    ) -> None:
        """Write a pipeline request's inputs and queue the steps that can run first."""
        plan = self.router.pipelines[entry.name].plan([o.name for o in body.outputs])
        route = Route(entry.name, version, request.id, -1, plan.outputs)
        try:
            effects = await self.router.start(request, plan, route)
        except RedisError as exc:
            raise Unavailable(
                f"cannot start the pipeline: {exc}", self.settings.retry_after_s
            ) from None
        for step_request, batch in effects.requests:
            model = self.catalog.models[step_request.model]
            await self._send(model, step_request, batch, 0, readmit)
        for _, payload in effects.replies:
            self._resolve(payload)

    def _request(
        self, entry: ModelEntry, version: str, body: InferBody, timeout_s: float
    ) -> InferRequest:
        now_ns = wire.now_ns()
        return InferRequest(
            id=f"{self.gateway_id}-{next(self._ids)}",
            model=entry.name,
            version=version,
            inputs=body.inputs,
            reply_to=self.reply_stream,
            deadline_ms=now_ns // 1_000_000 + int(timeout_s * 1000),
            outputs=[o.name for o in body.outputs],
            # The model's own: those the gateway acts on (timeout, priority, output
            # options) stay here; a Triton Python model reads the rest.
            parameters=model_parameters(body.parameters) if body.parameters else {},
            ts={Stamp.GATEWAY_IN: now_ns},
        )

    async def _send(
        self,
        entry: ModelEntry,
        request: InferRequest,
        batch: int,
        level: int,
        readmit: bool = False,
    ) -> None:
        settings = self.settings
        fields = wire.request_fields(request, batch, level)
        batching = entry.config.dynamic_batching
        # Triton's 0 (or no policy) is unbounded; here it is the gateway's default, so that
        # no model's queue can grow without bound unless the operator says so. A request
        # queued again (gateway.resubmission) was admitted once: no limit refuses it now.
        limit = batching.default_queue_policy.max_queue_size if batching else 0
        limit = 0 if readmit else limit or settings.default_max_queue_size
        level_limit = queue_fields(entry.config, request, level, fields, readmit)
        try:
            admitted = await self.admission.enqueue(
                request.model, request.version, fields, limit, readmit, (level, level_limit)
            )
        except RedisError as exc:  # OOM past maxmemory too: Redis refused the write
            raise Unavailable(f"cannot queue the request: {exc}", settings.retry_after_s) from None
        if admitted != ADMITTED:
            gauge = self.admission.gauge(request.model)
            bound = level_limit if admitted == LEVEL_FULL else limit
            raise refusal(request, admitted, bound, gauge, settings.retry_after_s)

    async def read_replies(self) -> None:
        """The reader task: runs for the gateway's life, whatever a read raises.

        A read that fails (Redis unreachable, the stream key replaced, anything else) is
        retried after a backoff (weir.redis_io.retry); until a read succeeds again,
        :attr:`reader_failure` says why and the gateway is not ready (gateway.health), since
        no reply can reach it.
        """
        last_id = b"0-0"
        retry = RetryWait()
        while True:
            try:
                last_id = await self._read_once(last_id)
            except Exception as exc:  # the reader outlives anything a read raises
                self.reader_failure = f"the reply reader failed: {type(exc).__name__}: {exc}"
                if isinstance(exc, RedisError):
                    logger.warning("reading replies failed, retrying: %s", exc)
                else:
                    logger.exception("reading replies failed, retrying")
                await retry.failed()
                continue
            retry.succeeded()
            self.reader_failure = None
            # Let the requests just answered send their responses before the next read
            # is packed and sent: that read can wait, they are the latency.
            await asyncio.sleep(0)

    async def _read_once(self, last_id: bytes) -> bytes:
        stream = self.reply_stream
        count, block_ms = self.settings.reply_read_count, self.settings.reply_block_ms
        await self.reply_link.connect()
        servers = await self._servers()
        if self.resubmitter.server_changed(servers):
            # Another server: its reply stream may lack entries, or not be there at all
            # (replies never create one), and its entry ids need not follow the last one
            # read. Make it, read it from the start, and queue again what it may have lost.
            # Should making it fail, the change is still unrecorded and the next read retries.
            raise_errors(await self.reply_link.call(("EVAL", ENSURE_SCRIPT, 1, stream)))
            last_id = b"0-0"
            self.resubmitter.resubmit_all()
            self.resubmitter.record(servers)
        _, result = raise_errors(
            await self.reply_link.call(
                ("XTRIM", stream, "MINID", last_id),
                ("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", stream, last_id),
                block_s=block_ms / 1000,
            )
        )
        for _, entries in result or []:
            for entry_id, fields in entries:
                self._read_entry(entry_id, fields)
                last_id = entry_id
        return last_id

    def _read_entry(self, entry_id: bytes, fields: list[bytes]) -> None:
        """Resolve the replies of one entry; log and skip what is not a reply."""
        try:
            payloads = wire.decode_batch(wire.flat_field(fields, wire.PAYLOAD))
        except Exception as exc:  # anything can be written to a stream
            logger.error("skipped reply entry %r: %s: %s", entry_id, type(exc).__name__, exc)
            return
        for payload in payloads:
            try:
                self._resolve(payload)
            except Exception as exc:
                name = type(exc).__name__
                logger.error("skipped a reply in entry %r: %s: %s", entry_id, name, exc)
                self._fail_malformed(payload, exc)

    def _resolve(self, payload: bytes) -> None:
        reply = InferReply.decode(payload)
        if reply.part is not None:
            listener = self.streaming.get(reply.id)
            if listener is not None:
                try:
                    listener.take(reply)
                except WeirError as exc:  # a part the request cannot take ends it
                    self._fail(reply.id, exc)
            return
        reply.ts[Stamp.GATEWAY_OUT] = time.time_ns()
        future = self.waiting.get(reply.id)
        if future is not None and not future.done():
            future.set_result(reply)

    async def _servers(self) -> tuple[bytes | None, int]:
        """What identifies the Redis servers behind the mesh now (gateway.resubmission).

        One server: the run_id the reply connection reached. A cluster: how often a slot's
        primary changed, in the admission link's map, fetched again every TOPOLOGY_CHECK_S.
        """
        link = self.admission.link
        now_s = time.monotonic()
        if now_s >= self._topology_checked_s + TOPOLOGY_CHECK_S:
            self._topology_checked_s = now_s
            try:
                await link.refresh()
            except RedisError as exc:
                logger.warning("could not learn the Redis servers again: %s", exc)
        return self.reply_link.server_id, link.epoch

    async def _resend(self, accepted: Accepted) -> None:
        if accepted.entry.config.is_ensemble:
            await self._start_route(
                accepted.entry, accepted.version, accepted.request, accepted.body, readmit=True
            )
        else:
            await self._send(
                accepted.entry, accepted.request, accepted.batch, accepted.level, readmit=True
            )

    def _fail(self, request_id: str, error: WeirError) -> None:
        future = self.waiting.get(request_id)
        if future is not None and not future.done():
            future.set_exception(error)

    def _fail_malformed(self, payload: object, exc: Exception) -> None:
        """Answer a malformed reply's request, when its id names one, with a 500 at once."""
        request_id = wire.reply_id(payload)
        future = self.waiting.get(request_id) if request_id is not None else None
        if future is not None and not future.done():
            message = f"the mesh sent a malformed reply: {type(exc).__name__}: {exc}"
            future.set_exception(ServerError(message))

    async def close(self) -> None:
        await self.resubmitter.close()
        await self.canceller.drain()
        await self.admission.link.close()
        await self.reply_link.close()
        try:
            await self.redis.delete(self.reply_stream)
        except RedisError:
            logger.warning("could not delete reply stream %s", self.reply_stream)
