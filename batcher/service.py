"""The batcher service: request streams in, batch streams out.

One reader task reads every request stream of the repository through the ``batcher``
consumer group (many entries per ``XREADGROUP``) and queues each entry on its model's
:class:`~batcher.policy.BatchQueue`. One dispatcher task per (model, version) waits on an
event, or on the oldest request's delay, and writes each batch that leaves together with
the ack of its requests in one transaction: nothing is acked before its batch is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from redis.asyncio import Redis

from batcher.policy import BatchQueue, Queued
from weir import names, wire
from weir.connection import connect
from weir.repository import ModelEntry, Repository
from weir.service import Service, TaskSet
from weir.settings import BatcherSettings
from weir.streams import Entry, StreamGroup
from weir.trim import Trimmer

logger = logging.getLogger(__name__)


class ModelLane:
    """The queue and the dispatcher of one (model, version)."""

    def __init__(self, redis: Redis, group: StreamGroup, entry: ModelEntry, version: str) -> None:
        self.redis = redis
        self.group = group
        self.request_stream = names.request_stream(entry.name, version)
        self.batch_stream = names.batch_stream(entry.name, version)
        batching = entry.config.dynamic_batching
        # Without dynamic_batching every request is its own batch, as Triton's default scheduler.
        self.queue = BatchQueue(
            entry.config.max_batch_size if batching else 1,
            batching.preferred_batch_size if batching else (),
            batching.max_queue_delay_microseconds / 1e6 if batching else 0.0,
        )
        self.batches = entry.config.max_batch_size > 0
        self.arrived = asyncio.Event()

    def add(self, entry: Entry, now_s: float) -> None:
        size = int(entry.fields.get(wire.BATCH_SIZE, b"1")) if self.batches else 1
        self.queue.add(Queued(entry.id, size, entry.fields[wire.PAYLOAD], now_s))
        self.arrived.set()

    async def dispatch(self, should_exit: asyncio.Event) -> None:
        """Send batches as the rule lets them leave, until told to exit and empty."""
        while not (should_exit.is_set() and not self.queue):
            await self._wait_for_batch(should_exit)
            batch = self.queue.take(time.monotonic())
            # On exit whatever is queued leaves now rather than waiting out its delay.
            if not batch and should_exit.is_set():
                batch = self.queue.take(float("inf"))
            if batch:
                await self._send(batch)

    async def _wait_for_batch(self, should_exit: asyncio.Event) -> None:
        deadline = self.queue.deadline_s()
        timeout = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if should_exit.is_set() or timeout == 0.0:
            return
        self.arrived.clear()
        waiters = [
            asyncio.ensure_future(self.arrived.wait()),
            asyncio.ensure_future(should_exit.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _send(self, batch: list[Queued]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(
                self.batch_stream, {wire.PAYLOAD: wire.encode_batch([q.payload for q in batch])}
            )
            self.group.ack(pipe, self.request_stream, [q.entry_id for q in batch])
            await pipe.execute()


class Batcher(Service):
    """Reads every request stream, forms batches, writes them to the batch streams."""

    name = "batcher"

    def __init__(self, settings: BatcherSettings) -> None:
        super().__init__(settings.shutdown_grace_s)
        self.settings = settings
        self.redis = connect(settings.redis_url)
        self.group = StreamGroup(
            self.redis, names.BATCHER_GROUP, f"batcher-{uuid.uuid4().hex[:12]}"
        )
        self.lanes: dict[str, ModelLane] = {}
        self.tasks = TaskSet()

    async def startup(self) -> None:
        repository = Repository.load(self.settings.repository)
        for entry in repository:
            for version in entry.versions:
                lane = ModelLane(self.redis, self.group, entry, version)
                self.lanes[lane.request_stream] = lane
        await self.group.ensure(list(self.lanes))
        logger.info("batcher reading %d request streams", len(self.lanes))

    async def run(self) -> None:
        dispatchers = [
            self.tasks.spawn(lane.dispatch(self.should_exit), f"dispatch {stream}")
            for stream, lane in self.lanes.items()
        ]
        trimmer = Trimmer(self.redis, names.BATCHER_GROUP, list(self.lanes))
        self.tasks.spawn(trimmer.run(self.settings.trim_interval_s, self.should_exit), "trim")
        await self._read_until_exit()
        # Intake has stopped; what the lanes hold still leaves, within the grace period.
        await asyncio.wait(dispatchers, timeout=self.settings.shutdown_grace_s)

    async def _read_until_exit(self) -> None:
        # A read is never cancelled: entries it took are pending on this consumer, so
        # they must reach a lane. Exit waits at most one block_ms.
        streams = list(self.lanes)
        while not self.should_exit.is_set():
            entries = await self.group.read(
                streams, self.settings.read_count, self.settings.block_ms
            )
            now_s = time.monotonic()
            for entry in entries:
                self.lanes[entry.stream].add(entry, now_s)

    async def shutdown(self) -> None:
        await self.tasks.cancel_all(self.settings.shutdown_grace_s)
        await self.redis.aclose()
