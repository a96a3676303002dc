"""One lane while it runs in a worker: its instances' tasks, its reader, its executor.

A lane can start and stop while the worker serves others (a model loaded, a new config, a
version retired): stopping stops its reader first, then waits for the batches it took to be
written and acked, then ends its instances and their threads.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from weir.service import TaskSet
from workers.lane import WorkerLane

logger = logging.getLogger(__name__)


class LaneRun:
    """The tasks and threads of one running :class:`~workers.lane.WorkerLane`."""

    def __init__(self, lane: WorkerLane) -> None:
        self.lane = lane
        self.stop = asyncio.Event()
        self.executor = ThreadPoolExecutor(
            max(len(lane.runners), 1), thread_name_prefix=f"instance-{lane.label}"
        )
        self.instances = TaskSet()
        self.reader: asyncio.Task[None] | None = None

    def start(self, tasks: TaskSet) -> None:
        lane = self.lane
        for runner in lane.runners:
            self.instances.spawn(lane.execute(runner, self.executor), f"instance {lane.label}")
        self.reader = tasks.spawn(lane.read(self.stop), f"read {lane.label}")

    async def stop_reading(self, timeout_s: float) -> None:
        self.stop.set()
        if self.reader is not None:
            await asyncio.wait([self.reader], timeout=timeout_s)

    async def drain(self, timeout_s: float) -> None:
        """Wait until every batch the lane took is written and acked."""
        await asyncio.wait([asyncio.ensure_future(self.lane.drain())], timeout=timeout_s)

    async def close(self, grace_s: float) -> None:
        await self.instances.cancel_all(grace_s)
        self.executor.shutdown(wait=False, cancel_futures=True)
        await self.lane.read_link.close()
        backends = {id(r.backend): r.backend for r in self.lane.runners}  # a shared one once
        for backend in backends.values():
            try:
                await asyncio.to_thread(backend.close)
            except Exception:
                logger.exception("closing an instance of %s failed", self.lane.label)

    async def end(self, read_timeout_s: float, grace_s: float) -> None:
        """Stop intake, finish what was taken, release the instances."""
        await self.stop_reading(read_timeout_s)
        await self.drain(grace_s)
        await self.close(grace_s)
        logger.info("lane %s stopped", self.lane.label)
