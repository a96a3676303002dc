"""One (model, version) served by a worker: a reader, ``count`` instances, the write-back.

The reader takes batches only while an instance is free, so a busy worker leaves batches on
the stream for its peers. Each instance decodes, runs and encodes a batch in an executor
thread, then one transaction writes every reply, records the batch's counters and acks the
batch: a batch is acked only after everything it produced is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor

from redis.asyncio import Redis

from weir import names, wire
from weir.errors import DeadlineExceeded
from weir.repository import ModelEntry
from weir.streams import Entry, StreamGroup
from weir.wire import InferReply, InferRequest
from workers.execution import BatchRunner

logger = logging.getLogger(__name__)


class Outcome:
    """What one batch produced, ready to write."""

    __slots__ = ("compute_ns", "executions", "replies")

    def __init__(self) -> None:
        self.replies: list[tuple[str, bytes]] = []
        self.executions: list[int] = []
        self.compute_ns = 0


class WorkerLane:
    """Serves one (model, version) from its batch stream."""

    def __init__(
        self,
        redis: Redis,
        group: StreamGroup,
        entry: ModelEntry,
        version: str,
        runners: list[BatchRunner],
    ) -> None:
        self.redis = redis
        self.group = group
        self.entry = entry
        self.version = version
        self.runners = runners
        self.stream = names.batch_stream(entry.name, version)
        self.stats_key = names.model_stats(entry.name, version)
        self.free = asyncio.Semaphore(len(runners))
        self.queue: asyncio.Queue[Entry] = asyncio.Queue(maxsize=len(runners))

    @property
    def label(self) -> str:
        return f"{self.entry.name}:{self.version}"

    async def read(self, should_exit: asyncio.Event, block_ms: int) -> None:
        """Take batches while instances are free, until told to exit."""
        while not should_exit.is_set():
            slots = await self._take_free_slots()
            entries = await self.group.read([self.stream], slots, block_ms)
            for entry in entries:
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

    async def execute(self, runner: BatchRunner, executor: Executor) -> None:
        """One instance: run batches from the queue for as long as the lane lives."""
        loop = asyncio.get_running_loop()
        while True:
            entry = await self.queue.get()
            try:
                outcome = await loop.run_in_executor(executor, self._process, runner, entry)
                await self._write(entry.id, outcome)
            finally:
                self.queue.task_done()
                self.free.release()

    def _process(self, runner: BatchRunner, entry: Entry) -> Outcome:
        requests = [InferRequest.decode(p) for p in wire.decode_batch(entry.fields[wire.PAYLOAD])]
        now_ms = time.time() * 1000
        live = [r for r in requests if r.deadline_ms > now_ms]
        outcome = Outcome()
        started = time.perf_counter_ns()
        replies, outcome.executions = runner.run(live) if live else ([], [])
        outcome.compute_ns = time.perf_counter_ns() - started
        by_id = {r.id: r for r in requests}
        for reply in replies:
            outcome.replies.append((by_id[reply.id].reply_to, reply.encode()))
        for request in requests:
            if request.deadline_ms <= now_ms:
                error = DeadlineExceeded(
                    f"deadline passed before model '{request.model}' version "
                    f"'{request.version}' ran the request"
                )
                outcome.replies.append(
                    (request.reply_to, InferReply.failure(request, error).encode())
                )
        return outcome

    async def _write(self, entry_id: bytes, outcome: Outcome) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            for reply_to, payload in outcome.replies:
                pipe.xadd(reply_to, {wire.PAYLOAD: payload})
            for size in outcome.executions:
                pipe.hincrby(self.stats_key, "execution_count", 1)
                pipe.hincrby(self.stats_key, "inference_count", size)
                pipe.hincrby(self.stats_key, f"batch_size:{size}", 1)
            if outcome.executions:
                pipe.hincrby(self.stats_key, "compute_ns", outcome.compute_ns)
            self.group.ack(pipe, self.stream, [entry_id])
            await pipe.execute()

    async def drain(self) -> None:
        """Wait until every batch taken from the stream is written and acked."""
        await self.queue.join()
