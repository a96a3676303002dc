"""Trimming streams below what their consumer group still needs.

Every mesh stream is read by exactly one consumer group. An entry can go once it has been
delivered and acknowledged: below the oldest pending entry, and at or below the group's
last delivered id. Trimming uses ``MINID ~`` so Redis drops whole nodes cheaply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir.streams import group_info

logger = logging.getLogger(__name__)


class Trimmer:
    """Trims a fixed set of streams read by one group, on an interval."""

    def __init__(self, redis: Redis, group: str, streams: list[str]) -> None:
        self.redis = redis
        self.group = group
        self.streams = streams

    async def run(self, interval_s: float, should_exit: asyncio.Event) -> None:
        while not should_exit.is_set():
            try:
                await self.trim_once()
            except RedisError as exc:
                logger.warning("stream trim failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(should_exit.wait(), interval_s)

    async def trim_once(self) -> None:
        """Two round trips for all streams: read group state, then trim."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream in self.streams:
                pipe.xinfo_groups(stream)
                pipe.xpending(stream, self.group)
            replies = await pipe.execute(raise_on_error=False)
        floors = {
            stream: _floor(self.group, groups, pending)
            for stream, groups, pending in zip(
                self.streams, replies[::2], replies[1::2], strict=True
            )
        }
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, floor in floors.items():
                if floor is not None:
                    pipe.xtrim(stream, minid=floor, approximate=True)
            await pipe.execute(raise_on_error=False)


def _floor(group: str, groups: object, pending: object) -> bytes | None:
    """The lowest id the group still needs, or None when nothing is known."""
    info = group_info(groups, group)
    if info is None or not isinstance(pending, dict):
        return None
    if pending.get("pending"):
        return pending["min"]  # type: ignore[no-any-return]
    return info.get("last-delivered-id")
