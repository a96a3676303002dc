"""One (model, version) served by a worker: a reader, ``count`` instances, the write-back.

The reader takes batches only while an instance is free, so a busy worker leaves batches on
the stream for its peers; now and then it first claims batches that a dead worker left
pending. Each instance decodes, runs and encodes a batch in an executor thread, then one
pipeline writes every reply (and a pipeline's next steps) and, in a transaction after
them, records the batch's counters, returns a credit to the batchers and acks the batch
(weir.stages): a batch is acked only after everything it produced is written. A batch
delivered too often is dead-lettered and each of its requests answered with an error, so a
poison input cannot crash-loop a pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

from redis.exceptions import RedisError

from pipelines.route import Router
from weir import names, stages, wire
from weir.errors import DeadlineExceeded, ServerError, WeirError
from weir.link import Command, HotLink
from weir.links import open_link
from weir.reclaim import Reclaimer
from weir.repository import ModelEntry
from weir.retry import RetryWait
from weir.settings import WorkerSettings
from weir.stats import (
    COMPUTE_PHASES,
    REQUEST_PHASES,
    Field,
    Stamp,
    batch_phase_field,
    batch_size_field,
    outcome_fields,
    phase_field,
)
from weir.streams import Entry, StreamGroup
from weir.wire import InferReply, InferRequest
from workers.batch_wait import never, sort_requests
from workers.execution import BatchRunner, Execution

logger = logging.getLogger(__name__)


# KEYS: the statistics hash. ARGV: the batch's last_inference (unix ms, 0 for none), then
# field, increment, field, increment ... last_inference only ever moves forward.
_ADD_STATS = """
local last = tonumber(ARGV[1])
if last > tonumber(redis.call('HGET', KEYS[1], 'last_inference') or '0') then
  redis.call('HSET', KEYS[1], 'last_inference', ARGV[1])
end
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
"""


class Outcome:
    """What one batch produced, ready to write."""

    __slots__ = (
        "answered", "compute_ns", "executions", "forwards", "last_inference_ms", "phases",
        "replies", "routed",
    )  # fmt: skip

    def __init__(self) -> None:
        self.replies: list[tuple[str, bytes]] = []
        self.executions: list[Execution] = []
        self.compute_ns = 0
        self.answered = 0
        self.last_inference_ms = 0  # when a backend call of the batch last succeeded
        # Per request, summed: success/fail counts and nanoseconds, queue and compute time.
        self.phases: dict[str, int] = {}
        # Pipeline steps that finished, and the step requests they lead to.
        self.routed: list[tuple[InferRequest, InferReply]] = []
        self.forwards: list[tuple[InferRequest, int]] = []


class WorkerLane:
    """Serves one (model, version) from its batch stream."""

    def __init__(
        self,
        link: HotLink,
        group: StreamGroup,
        entry: ModelEntry,
        version: str,
        runners: list[BatchRunner],
        settings: WorkerSettings,
        router: Router,
    ) -> None:
        self.link = link  # the worker's, for transactions (they never block)
        self.read_link = open_link(
            settings.redis_url, settings.redis_timeout_s
        )  # this lane's own, for blocking reads
        self.group = group
        self.entry = entry
        self.version = version
        self.stamp = entry.stamp(version)  # the config and files it loaded (model control)
        self.runners = runners
        self.settings = settings
        self.router = router
        self.stream = names.batch_stream(entry.name, version)
        self.stats_key = names.model_stats(entry.name, version)
        self.credit_stream = names.credit_stream(entry.name, version)
        self.dead_stream = names.dead_letter_stream(entry.name, version)
        self.cancel_stream = names.cancel_stream(entry.name, version)
        self.is_canceled: Callable[[str], bool] = never  # the worker's cancel watch's
        self.reclaimer = Reclaimer(group, settings.reclaim_idle_ms, settings.max_deliveries)
        self.held: set[bytes] = set()  # entries taken and not yet acked
        self.free = asyncio.Semaphore(len(runners))
        self.queue: asyncio.Queue[Entry] = asyncio.Queue(maxsize=len(runners))
        self.compute_ewma_ns: int | None = None  # recent compute time of a batch
        self.last_batch_s = 0.0  # monotonic time the last batch was written

    @property
    def label(self) -> str:
        return f"{self.entry.name}:{self.version}"

    def credit(self, instances: int) -> Command:
        """The command that gives the batchers a credit of ``instances`` free slots."""
        return ("XADD", self.credit_stream, "*", wire.CREDITS, instances)

    async def read(self, should_exit: asyncio.Event) -> None:
        """Take batches while instances are free, until told to exit."""
        next_reclaim = 0.0
        pending_after: bytes | None = b"0"
        retry = RetryWait()
        while not should_exit.is_set():
            slots = await self._take_free_slots()
            try:
                entries: list[Entry] = []
                if pending_after is not None:
                    entries = await self.group.read(
                        self.read_link, [self.stream], slots, 0, pending_after
                    )
                    pending_after = entries[-1].id if entries else None
                if not entries and time.monotonic() >= next_reclaim:
                    entries = await self._reclaim(slots)
                    next_reclaim = time.monotonic() + self.settings.reclaim_interval_s
                if not entries:
                    entries = await self.group.read(
                        self.read_link, [self.stream], slots, self.settings.block_ms
                    )
            except RedisError as exc:
                logger.warning("reading batches of %s failed, retrying: %s", self.label, exc)
                entries = []
                await retry.failed()
            else:
                retry.succeeded()
            for entry in entries:
                self.held.add(entry.id)
                self.queue.put_nowait(entry)
            for _ in range(slots - len(entries)):
                self.free.release()

    async def _take_free_slots(self) -> int:
        await self.free.acquire()
        slots = 1
        while not self.free.locked():
            await self.free.acquire()
            slots += 1
        return slots

    async def _reclaim(self, slots: int) -> list[Entry]:
        claimed = await self.reclaimer.claim(self.stream, slots, self.held)
        for entry, deliveries in claimed.poisoned:
            await self._dead_letter(entry, f"delivered {deliveries} times")
        if claimed.retry:
            logger.info(
                "claimed %d batches of %s from dead workers", len(claimed.retry), self.label
            )
        return claimed.retry

    async def execute(self, runner: BatchRunner, executor: Executor) -> None:
        """One instance: run batches from the queue for as long as the lane lives."""
        loop = asyncio.get_running_loop()
        while True:
            entry = await self.queue.get()
            try:
                if self._inline():
                    outcome = self._process(runner, entry)
                else:
                    outcome = await loop.run_in_executor(executor, self._process, runner, entry)
                self._observe(outcome)
            except Exception as exc:
                logger.exception("batch %s of %s cannot be processed", entry.id, self.label)
                await self._dead_letter(entry, f"cannot be processed: {exc}")
            else:
                await self._write(entry.id, outcome)
            finally:
                self.last_batch_s = time.monotonic()
                self.held.discard(entry.id)
                self.queue.task_done()
                self.free.release()

    def _inline(self) -> bool:
        # A batch that computes in less time than a trip through an executor thread costs
        # runs in the event loop; until a batch has been timed, assume it would not.
        limit_ns = self.settings.inline_compute_us * 1000
        return self.compute_ewma_ns is not None and self.compute_ewma_ns < limit_ns

    def _observe(self, outcome: Outcome) -> None:
        if not outcome.executions:
            return
        recent = self.compute_ewma_ns
        sample = outcome.compute_ns
        self.compute_ewma_ns = sample if recent is None else (recent * 7 + sample) // 8

    def _process(self, runner: BatchRunner, entry: Entry) -> Outcome:
        requests = _decode(entry)
        live, expired, canceled = sort_requests(requests, time.time() * 1000, self.is_canceled)
        outcome = Outcome()
        started = time.perf_counter_ns()
        replies, outcome.executions = runner.run_batch(live, self.is_canceled) if live else ([], [])
        outcome.compute_ns = time.perf_counter_ns() - started
        by_id = {r.id: r for r in requests}
        outcome.phases = _phase_totals(replies, by_id, [*expired, *canceled], wire.now_ns())
        if any(e.phases_ns is not None for e in outcome.executions):
            outcome.last_inference_ms = time.time_ns() // 1_000_000
        for reply in replies:
            request = by_id[reply.id]
            if request.route is not None:
                outcome.routed.append((request, reply))
            else:
                outcome.replies.append((request.reply_to, reply.encode()))
        for request in expired:
            error = DeadlineExceeded(DeadlineExceeded.TRITON_TEXT)  # expired while queued
            outcome.replies.append((request.reply_to, _failure(request, error)))
        outcome.answered = len(requests)
        return outcome

    async def _write(
        self, entry_id: bytes, outcome: Outcome, dead: tuple[bytes, ...] | None = None
    ) -> None:
        """Write a batch's effects and ack it in one transaction, retrying while Redis is down."""
        retry = RetryWait()
        while True:
            try:
                if outcome.routed:
                    effects = await self.router.advance(outcome.routed)
                    outcome.routed = []
                    outcome.replies.extend(effects.replies)
                    outcome.forwards.extend(effects.requests)
                outside, inside = self._effects(entry_id, outcome)
                if dead is not None:
                    inside.insert(0, ("XADD", self.dead_stream, "*", *dead))
                await stages.effects(self.link, outside, inside)
                return
            except RedisError as exc:
                logger.warning("writing replies of %s failed, retrying: %s", self.label, exc)
                await retry.failed()

    def _effects(self, entry_id: bytes, outcome: Outcome) -> tuple[list[Command], list[Command]]:
        """The batch's effects on other slots (replies, forwards), and on its model's."""
        outside = stages.answer(outcome.replies, self.settings.reply_maxlen)
        outside.extend(stages.forward(request, batch) for request, batch in outcome.forwards)
        commands: list[Command] = []
        increments = _stat_increments(outcome)
        if increments:
            # EVAL, not EVALSHA: inside MULTI a script missing from a restarted Redis's cache
            # would fail alone and the rest of the transaction would still commit.
            last = outcome.last_inference_ms
            commands.append(("EVAL", _ADD_STATS, 1, self.stats_key, last, *increments))
        commands.append(stages.settle(self.entry.name, self.version, outcome.answered))
        commands.append(self.credit(1))
        commands.append(self.group.ack(self.stream, [entry_id]))
        return outside, commands

    async def _dead_letter(self, entry: Entry, reason: str) -> None:
        """Park a batch on the dead-letter stream; answer each request with a 500."""
        payload = entry.fields.get(wire.PAYLOAD, b"")
        outcome = Outcome()
        error = ServerError(
            f"batch of model '{self.entry.name}' version '{self.version}' "
            f"was dead-lettered: {reason}"
        )
        try:
            requests = _decode(entry)
        except Exception:
            requests = []
            logger.error("dead-lettered batch %s of %s is undecodable", entry.id, self.label)
        for request in requests:
            outcome.replies.append((request.reply_to, _failure(request, error)))
        outcome.answered = len(requests)
        outcome.phases = _phase_totals([], {}, requests, wire.now_ns())
        logger.error("dead-lettering batch %s of %s: %s", entry.id, self.label, reason)
        dead = (wire.PAYLOAD, payload, b"reason", reason.encode(), b"id", entry.id)
        await self._write(entry.id, outcome, dead)

    async def drain(self) -> None:
        """Wait until every batch taken from the stream is written and acked."""
        await self.queue.join()


def _stat_increments(outcome: Outcome) -> list[str | int]:
    """Field, increment, field, increment ... for the model's statistics hash.

    As Triton: executions, inferences and batch statistics count successful backend calls.
    """
    counts: dict[str, int] = {}
    for execution in outcome.executions:
        if execution.phases_ns is not None:
            _count_execution(counts, execution.batch_size, execution.phases_ns)
    if outcome.executions:
        counts[Field.COMPUTE_NS] = outcome.compute_ns
    counts.update(outcome.phases)
    return [item for pair in counts.items() for item in pair]


def _count_execution(counts: dict[str, int], size: int, phases_ns: tuple[int, ...]) -> None:
    increments = {Field.EXECUTION_COUNT: 1, Field.INFERENCE_COUNT: size, batch_size_field(size): 1}
    for phase, ns in zip(COMPUTE_PHASES, phases_ns, strict=True):
        increments[batch_phase_field(phase, size)] = ns
    for key, increment in increments.items():
        counts[key] = counts.get(key, 0) + increment


def _decode(entry: Entry) -> list[InferRequest]:
    try:
        return [InferRequest.decode(p) for p in wire.decode_batch(entry.fields[wire.PAYLOAD])]
    except (KeyError, ValueError, TypeError) as exc:
        raise WeirError(f"undecodable batch: {exc}") from exc


def _failure(request: InferRequest, error: WeirError) -> bytes:
    """An error reply; a pipeline step's goes to the pipeline request it serves."""
    reply = InferReply.failure(request, error)
    if request.route is not None:
        reply.id = str(request.route["request_id"])
        error_message = (
            f"pipeline '{request.route['pipeline']}' step {request.route['step']} "
            f"(model '{request.model}' version {request.version}): {error.message}"
        )
        reply.error = (error.kind, error_message)
    return reply.encode()


def _phase_totals(
    replies: list[InferReply],
    requests: Mapping[str, InferRequest],
    failed: list[InferRequest],
    end_ns: int,
) -> dict[str, int]:
    """Counts and summed nanoseconds of each phase over a batch's replies.

    As Triton: a request's success or fail time runs from the gateway taking it to
    ``end_ns``, when its batch is recorded; ``failed`` are requests answered without a run.
    """
    totals: dict[str, int] = {}
    for reply in replies:
        _add_request(totals, reply.error is None, requests[reply.id], end_ns)
        if reply.error is None:
            _add_phases(totals, reply.ts)
    for request in failed:
        _add_request(totals, False, request, end_ns)
    return {k: v for k, v in totals.items() if v}


def _add_request(
    totals: dict[str, int], succeeded: bool, request: InferRequest, end_ns: int
) -> None:
    count, ns = outcome_fields(succeeded)
    totals[count] = totals.get(count, 0) + 1
    if Stamp.GATEWAY_IN in request.ts:
        waited = max(end_ns - request.ts[Stamp.GATEWAY_IN], 0)
        totals[ns] = totals.get(ns, 0) + waited


def _add_phases(totals: dict[str, int], ts: Mapping[str, int]) -> None:
    for phase in REQUEST_PHASES:
        if phase.start in ts and phase.end in ts:
            key = phase_field(phase)
            totals[key] = totals.get(key, 0) + max(ts[phase.end] - ts[phase.start], 0)
