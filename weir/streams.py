"""One small class that owns the consumer-group side of the mesh's streams.

A service creates its group on each stream it reads (only BUSYGROUP is ignored), reads new
entries from many streams in one ``XREADGROUP`` with ``BLOCK``/``COUNT`` (over a hot-path
:class:`~weir.redis_io.link.Link`), and acks explicitly, inside the same transaction that writes the
entry's effect, so nothing is acked before what it produced is in Redis.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from weir.redis_io.fanin import FanIn
from weir.redis_io.link import Arg, Command, HotLink


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry as read through a group."""

    stream: str
    id: bytes
    fields: dict[bytes, bytes]


class StreamGroup:
    """A consumer in one consumer group, over any number of streams."""

    def __init__(self, redis: Redis, group: str, consumer: str) -> None:
        self.redis = redis
        self.group = group
        self.consumer = consumer
        # Each reading link's blocking reads, split by cluster slot (weir.redis_io.fanin).
        self._fanins: dict[HotLink, FanIn] = {}

    async def ensure(self, streams: list[str]) -> None:
        """Create the group on each stream (and the stream itself) if missing."""
        for stream in streams:
            try:
                await self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def recover(self, error: RedisError, streams: list[str]) -> None:
        """After a read or claim failed: make the groups again if Redis lost them.

        A Redis that restarted without its data (or a replica promoted before the groups
        reached it) answers NOGROUP to every read and claim until the groups exist again.
        """
        if "NOGROUP" in str(error):
            with contextlib.suppress(RedisError):
                await self.ensure(streams)

    async def read(
        self,
        link: HotLink,
        streams: list[str],
        count: int,
        block_ms: int,
        pending_after: bytes | None = None,
    ) -> list[Entry]:
        """New entries from any of ``streams``: at most ``count`` per stream.

        With ``pending_after``, instead the entries after that id already delivered to this
        consumer and not acked (a consumer restarted under its name resumes its work). A read
        that blocks holds ``link`` until it returns: each blocking reader has its own.
        """
        if not streams:
            return []
        start = ">" if pending_after is None else pending_after
        command: list[Arg] = ["XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count]
        if block_ms:
            command += ["BLOCK", block_ms]

        def build(some: list[str]) -> Command:
            return [*command, "STREAMS", *some, *([start] * len(some))]

        fanin = self._fanins.get(link)
        if fanin is None:
            fanin = self._fanins[link] = FanIn(link)
        found: list[Entry] = []
        for reply in await fanin.read(build, streams, block_ms / 1000):
            if isinstance(reply, ResponseError):
                # A Redis that restarted without its data has lost the groups: make them again.
                if "NOGROUP" not in str(reply):
                    raise reply
                await self.ensure(streams)
                continue
            found.extend(
                Entry(_text(stream), entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))
                for stream, entries in reply or []
                for entry_id, flat in entries
                if flat is not None  # an entry deleted since its delivery
            )
        return found

    def ack(self, stream: str, ids: list[bytes]) -> Command:
        """The command that acks ``ids``; callers send it with what the entries produced."""
        return ("XACK", stream, self.group, *ids)


def group_info(groups: object, group: str) -> dict[str, Any] | None:
    """``group``'s entry in an ``XINFO GROUPS`` reply (None if absent or not a reply)."""
    if not isinstance(groups, list):
        return None
    return next((g for g in groups if _text(g.get("name", b"")) == group), None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
