"""One (model, version) served by a worker: a reader, ``count`` instances, the write-back.

The reader takes batches only while an instance is free, so a busy worker leaves batches on
the stream for its peers; now and then it first claims batches that a dead worker left
pending, and hands those delivered too often to be dead-lettered. Each instance decodes,
runs and encodes a batch, in an executor thread unless the lane's batches compute faster
than a trip through one, and hands what the batch produced (an :class:`Outcome`) to the
lane's :class:`~workers.write_back.WriteBack`, which writes it and acks the batch; a batch
that cannot be processed is dead-lettered there too. Draining waits until every batch taken
is written and acked.

A model with a response timeout (its ``response_timeout_s`` parameter; TorchServe's
``responseTimeout``) runs every batch in a thread, so the event loop sees one run past it:
that batch is dead-lettered (each request answered with a 500) and the worker exits, as
TorchServe restarts a backend worker that stopped answering. A thread cannot be stopped;
its supervisor (``weir up``, Compose, Kubernetes) starts a fresh worker, and the batches
the old one held are claimed by live workers, as after any crash. A batch run in the event
loop is watched by the worker's stall guard instead (:mod:`workers.stall`): past
``WEIR_WORKER_INLINE_STALL_S`` it is dead-lettered and the worker exits the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor

from redis.exceptions import RedisError

from pipelines.route import Router
from weir import names, wire
from weir.errors import DeadlineExceeded
from weir.reclaim import Reclaimer
from weir.redis_io.link import HotLink
from weir.redis_io.links import open_link
from weir.redis_io.retry import RetryWait
from weir.repository import ModelEntry
from weir.settings import WorkerSettings
from weir.streams import Entry, StreamGroup
from workers.batch_wait import never, sort_requests
from workers.execution import BatchRunner
from workers.parts import PartWriter
from workers.sequences import Batch, SequenceModel
from workers.stall import StallGuard, exit_stuck
from workers.write_back import Outcome, WriteBack, decode_requests, failure_reply, phase_totals

logger = logging.getLogger(__name__)


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
        stall: StallGuard | None = None,
    ) -> None:
        self.read_link = open_link(
            settings.redis_url, settings.redis_timeout_s
        )  # this lane's own, for blocking reads
        self.group = group
        self.entry = entry
        self.version = version
        self.stamp = entry.stamp(version)  # the config and files it loaded (model control)
        self.runners = runners
        self.settings = settings
        self.stream = names.batch_stream(entry.name, version)
        self.credit_stream = names.credit_stream(entry.name, version)
        self.cancel_stream = names.cancel_stream(entry.name, version)
        self.is_canceled: Callable[[str], bool] = never  # the worker's cancel watch's
        self.reclaimer = Reclaimer(group, settings.reclaim_idle_ms, settings.max_deliveries)
        self.held: set[bytes] = set()  # entries taken and not yet acked
        self.free = asyncio.Semaphore(len(runners))
        self.queue: asyncio.Queue[Entry] = asyncio.Queue(maxsize=len(runners))
        # Recent cost of a batch: the CPU time of the thread that ran it, and its wall time.
        self.compute_ewma_ns: int | None = None
        self.wall_ewma_ns: int | None = None
        self.last_batch_s = 0.0  # monotonic time the last batch was written
        self.response_timeout_s = runners[0].config.response_timeout_s if runners else None
        # On the worker's link (its transactions never block), not the lane's reading one.
        self.write_back = WriteBack(link, group, entry, version, router, settings, self.label)
        self.stall = stall  # the worker's watch over batches run in the event loop
        self.parts = PartWriter(link, entry.config, settings.reply_maxlen, settings.redis_timeout_s)
        for runner in runners:
            runner.part_sink = self.parts.sink
        stateful = entry.config.sequence_batching is not None
        self.sequences = SequenceModel(entry.config, entry.path, version) if stateful else None

    @property
    def label(self) -> str:
        return f"{self.entry.name}:{self.version}"

    @property
    def router(self) -> Router:
        """Routes finished pipeline steps; the worker swaps it when its pipelines change."""
        return self.write_back.router

    @router.setter
    def router(self, router: Router) -> None:
        self.write_back.router = router

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
                await self.group.recover(exc, [self.stream])
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
            await self.write_back.dead_letter(entry, f"delivered {deliveries} times")
        if claimed.retry:
            logger.info(
                "claimed %d batches of %s from dead workers", len(claimed.retry), self.label
            )
        return claimed.retry

    async def execute(self, runner: BatchRunner, executor: Executor) -> None:
        """One instance: run batches from the queue for as long as the lane lives."""
        loop = self.parts.loop = asyncio.get_running_loop()
        while True:
            entry = await self.queue.get()
            try:
                batch = await self._sequence_batch(entry)
                if self._inline():
                    outcome = self._process_inline(runner, entry, batch)
                else:
                    outcome = await self._in_thread(loop, executor, runner, entry, batch)
                self._observe(outcome)
            except Exception as exc:
                logger.exception("batch %s of %s cannot be processed", entry.id, self.label)
                await self.write_back.dead_letter(entry, f"cannot be processed: {exc}")
            else:
                await self.parts.flush()  # a batch run in the loop sent its parts here
                await self.write_back.write(entry.id, outcome)
            finally:
                self.last_batch_s = time.monotonic()
                self.held.discard(entry.id)
                self.queue.task_done()
                self.free.release()

    async def _sequence_batch(self, entry: Entry) -> Batch | None:
        """A sequence model's batch, with its sequences' states read (workers.sequences)."""
        if self.sequences is None:
            return None
        return await self.sequences.read(self.write_back.link, decode_requests(entry))

    def _process_inline(self, runner: BatchRunner, entry: Entry, batch: Batch | None) -> Outcome:
        """The batch's outcome, run in the event loop under the worker's stall guard."""
        if self.stall is None:
            return self._process(runner, entry, batch)
        self.stall.begin(entry, self.write_back)
        try:
            return self._process(runner, entry, batch)
        finally:
            self.stall.end()

    async def _in_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        executor: Executor,
        runner: BatchRunner,
        entry: Entry,
        batch: Batch | None,
    ) -> Outcome:
        """The batch's outcome, run in ``executor``; past the response timeout, the exit."""
        running = loop.run_in_executor(executor, self._process, runner, entry, batch)
        timeout_s = self.response_timeout_s
        if timeout_s is None:
            return await running
        try:
            return await asyncio.wait_for(asyncio.shield(running), timeout_s)
        except TimeoutError:
            limit = f"response timeout ({timeout_s:g} s)"
            await self.write_back.dead_letter(entry, f"it ran past the model's {limit}")
            exit_stuck(f"a batch of {self.label} ran past its {limit}")

    def _inline(self) -> bool:
        """Whether the next batch runs in the event loop rather than an executor thread.

        The trip through a thread costs the worker CPU on every batch (a hand-over each way,
        the GIL taken back), and buys two things: instances computing side by side, and an
        event loop free to read, write and beat while a batch computes. So a lane of one
        instance runs its batches in the loop unless they take long in wall time
        (``inline_block_us``: a slow model, or a handler that sleeps or waits on I/O); a
        lane of several does only when a batch costs less CPU time than the trip is worth
        (``inline_compute_us``). CPU time, not wall time: on a busy machine a batch's wall
        time is mostly other processes' turns on the cores. Until a batch has been timed,
        assume a thread.
        """
        settings = self.settings
        if self.compute_ewma_ns is None or self.wall_ewma_ns is None:
            return False
        if self.response_timeout_s is not None:  # a thread, so the loop sees it run too long
            return False
        if self.parts.used:  # a thread, so each part goes out as it is sent
            return False
        if getattr(self.runners[0].backend, "waits_on_the_loop", False):  # it would hang there
            return False
        if settings.inline_compute_us == 0 or self.wall_ewma_ns >= settings.inline_block_us * 1000:
            return False
        return len(self.runners) == 1 or self.compute_ewma_ns < settings.inline_compute_us * 1000

    def _observe(self, outcome: Outcome) -> None:
        if not outcome.executions:
            return
        self.compute_ewma_ns = _ewma(self.compute_ewma_ns, outcome.compute_cpu_ns)
        self.wall_ewma_ns = _ewma(self.wall_ewma_ns, outcome.compute_ns)

    def _process(self, runner: BatchRunner, entry: Entry, batch: Batch | None = None) -> Outcome:
        requests = batch.requests if batch is not None else decode_requests(entry)
        live, expired, canceled = sort_requests(requests, time.time() * 1000, self.is_canceled)
        outcome = Outcome()
        if batch is not None:
            batch.fill(live)
        started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
        replies, outcome.executions = runner.run_batch(live, self.is_canceled) if live else ([], [])
        outcome.compute_ns = time.perf_counter_ns() - started
        outcome.compute_cpu_ns = time.thread_time_ns() - started_cpu
        if batch is not None:
            outcome.sequence_commands = batch.finish(replies)
            outcome.sequence_keys = batch.keys()
        by_id = {r.id: r for r in requests}
        outcome.phases = phase_totals(replies, by_id, [*expired, *canceled], wire.now_ns())
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
            outcome.replies.append((request.reply_to, failure_reply(request, error)))
        outcome.answered = len(requests)
        return outcome

    async def drain(self) -> None:
        """Wait until every batch taken from the stream is written and acked."""
        await self.queue.join()


def _ewma(recent: int | None, sample: int) -> int:
    return sample if recent is None else (recent * 7 + sample) // 8
