"""The gateway's side of cancellation: tell the mesh which requests nobody waits for.

When a client leaves, :meth:`Canceller.cancel` queues a notice for the cancel streams of
the models that may hold its request (a pipeline's: each step's); the notices of one event
loop turn go out in one pipeline, so two thousand clients that leave at once cost a few
round trips, not two thousand. Cancelling is best effort: a notice that cannot be written
is logged, and the request's deadline still bounds what it costs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from redis.exceptions import RedisError

from weir.cancels import notice
from weir.redis_io.link import HotLink, raise_errors

logger = logging.getLogger(__name__)


class Canceller:
    """Gathers cancelled request ids per cancel stream and writes them as notices."""

    def __init__(self, link: HotLink) -> None:
        self.link = link
        self.pending: dict[str, tuple[list[str], int]] = {}  # stream -> (ids, until ms)
        self.tasks: set[asyncio.Task[None]] = set()
        self.canceled = 0  # requests cancelled since start
        self._scheduled = False  # a flush will take what is pending

    def cancel(self, streams: Iterable[str], request_id: str, until_ms: int) -> None:
        """Queue a notice for ``request_id`` on each of ``streams``; written this loop turn."""
        self.canceled += 1
        for stream in streams:
            ids, latest_ms = self.pending.get(stream, ([], 0))
            ids.append(request_id)
            self.pending[stream] = (ids, max(latest_ms, until_ms))
        if not self._scheduled:
            self._scheduled = True
            task = asyncio.get_running_loop().create_task(self._flush())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the other cancellations of this turn join the same write
        pending, self.pending = self.pending, {}
        self._scheduled = False
        commands = [notice(stream, ids, until_ms) for stream, (ids, until_ms) in pending.items()]
        try:
            raise_errors(await self.link.call(*commands))
        except RedisError as exc:
            count = sum(len(ids) for ids, _ in pending.values())
            logger.warning("could not tell the mesh of %d cancelled requests: %s", count, exc)

    async def drain(self) -> None:
        """Wait for the notices being written (at shutdown)."""
        if self.tasks:
            await asyncio.wait(list(self.tasks))
