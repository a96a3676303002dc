"""Claiming the pending entries of dead consumers, and spotting poison entries.

A consumer that dies (SIGKILL, a lost node) leaves entries pending in its group. A live
consumer claims those whose owner has no live key and that have been idle at least
``min_idle_ms``: they are processed again (at-least-once; the gateway answers each request
once). An entry delivered more than ``max_deliveries`` times is returned apart, for the
caller to dead-letter instead of running it again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis

from weir.liveness import live_consumers
from weir.streams import Entry, StreamGroup


@dataclass(frozen=True, slots=True)
class Claimed:
    """Entries taken over from dead consumers."""

    retry: list[Entry]
    poisoned: list[tuple[Entry, int]]


class Reclaimer:
    """Takes over dead consumers' pending entries for one consumer of a group."""

    def __init__(self, group: StreamGroup, min_idle_ms: int, max_deliveries: int = 0) -> None:
        self.group = group
        self.redis: Redis = group.redis
        self.min_idle_ms = min_idle_ms
        self.max_deliveries = max_deliveries

    async def claim(self, stream: str, count: int, held: Collection[bytes] = ()) -> Claimed:
        """Up to ``count`` entries of ``stream`` whose owners are dead, or lost by this one.

        An entry pending on this very consumer that it does not hold (``held``: what it has
        queued or is working on) was delivered in a reply lost with its connection; it is
        taken again like a dead consumer's.
        """
        pending: list[dict[str, Any]] = await self.redis.xpending_range(
            stream,
            self.group.group,
            min="-",
            max="+",
            count=max(count * 4, 16),
            idle=self.min_idle_ms,
        )
        if not pending:
            return Claimed([], [])
        live = await live_consumers(self.redis, self.group.group)
        orphans = [p for p in pending if self._orphaned(p, live, held)][:count]
        if not orphans:
            return Claimed([], [])
        deliveries = {p["message_id"]: int(p["times_delivered"]) + 1 for p in orphans}
        reply = await self.redis.xclaim(
            stream,
            self.group.group,
            self.group.consumer,
            self.min_idle_ms,
            [p["message_id"] for p in orphans],
        )
        claimed = cast(list[tuple[bytes, dict[bytes, bytes] | None]], reply)
        entries = [Entry(stream, entry_id, fields) for entry_id, fields in claimed if fields]
        return self._sort(entries, deliveries)

    def _orphaned(
        self, pending: dict[str, Any], live: Collection[str], held: Collection[bytes]
    ) -> bool:
        owner = _text(pending["consumer"])
        if owner == self.group.consumer:
            return pending["message_id"] not in held
        return owner not in live

    def _sort(self, entries: list[Entry], deliveries: dict[bytes, int]) -> Claimed:
        if not self.max_deliveries:
            return Claimed(entries, [])
        retry = [e for e in entries if deliveries.get(e.id, 0) <= self.max_deliveries]
        poisoned = [
            (e, deliveries[e.id]) for e in entries if deliveries.get(e.id, 0) > self.max_deliveries
        ]
        return Claimed(retry, poisoned)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
