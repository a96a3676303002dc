"""Blocking reads of many streams that may lie on different Redis Cluster slots.

One ``XREAD``/``XREADGROUP`` may name many streams only if they share a slot, so a reader
of many models' streams on a cluster sends one blocking read per slot, each on its own
connection (the link's per-slot connections), and returns what the first ones to answer
brought. The others are never cancelled (entries a consumer-group read took are pending on
the consumer: they must reach it): they stay outstanding and the next read returns their
answers. On one server every stream has slot 0, and a read is one command, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from weir.redis_io.link import Command, HotLink

logger = logging.getLogger(__name__)


class FanIn:
    """The blocking reads of one reader; ``build(streams)`` makes one read's command."""

    def __init__(self, link: HotLink) -> None:
        self.link = link
        self._outstanding: dict[int, asyncio.Future[list[Any]]] = {}

    async def read(
        self, build: Callable[[list[str]], Command], streams: list[str], block_s: float
    ) -> list[Any]:
        """The replies of the reads that answered, one per slot (each a read's one reply).

        A read that failed raises its RedisError when no other brought anything; else it is
        logged, and its slot is read again next time.
        """
        groups: dict[int, list[str]] = {}
        slot_of = self.link.slot_of
        for stream in streams:
            groups.setdefault(slot_of(stream), []).append(stream)
        if len(groups) == 1 and not self._outstanding:  # one server: one command, no task
            (replies,) = groups.values()
            return [(await self.link.call(build(replies), block_s=block_s))[0]]
        for slot, group in groups.items():
            if slot not in self._outstanding:
                call = self.link.call(build(group), block_s=block_s)
                self._outstanding[slot] = asyncio.ensure_future(call)
        await asyncio.wait(self._outstanding.values(), return_when=asyncio.FIRST_COMPLETED)
        return self._collect()

    def _collect(self) -> list[Any]:
        """The answers of the reads that are done; the others stay outstanding."""
        replies: list[Any] = []
        failure: BaseException | None = None
        for slot, future in list(self._outstanding.items()):
            if not future.done():
                continue
            del self._outstanding[slot]
            error = future.exception()
            if error is None:
                replies.append(future.result()[0])
            elif failure is None:
                failure = error
            else:
                logger.warning("a read of slot %d failed: %s", slot, error)
        if failure is not None:
            if not replies:
                raise failure
            logger.warning("a read failed, the others' entries kept: %s", failure)
        return replies

    async def close(self) -> None:
        """Wait for the outstanding reads (each ends within its block time)."""
        if self._outstanding:
            await asyncio.wait(self._outstanding.values())
        self._outstanding.clear()
