"""Liveness of consumers: a registry per group that each live consumer keeps refreshing.

A group's registry is a hash (consumer -> heartbeat value) and a sorted set (consumer ->
when it stops counting as live, by Redis's clock), written together by each beat. Reading
the live consumers drops the expired ones in the same script, so what a read costs grows
with the group's consumers, never with the keyspace (a ``SCAN`` over every key did before).

Workers put what they serve in the value (``[[model, version, instances], ...]``) so the
gateway can tell whether a model is ready and the batcher how many instances a lane has.
A consumer whose beat expired is dead: its pending entries may be claimed by the living.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names

logger = logging.getLogger(__name__)

# Every script takes its time from Redis (TIME), as a key's TTL did: hosts' clocks may differ.
_NOW_MS = """
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
"""

# KEYS: values, expiry. ARGV: consumer, value, ttl_ms.
_BEAT = (
    _NOW_MS
    + """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
"""
)

# KEYS: values, expiry. Drops the expired consumers; returns the rest, consumer, value, ...
# (HDEL in slices: Lua's unpack has a stack limit.)
_LIVE = (
    _NOW_MS
    + """
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #dead, 1000 do
  redis.call('HDEL', KEYS[1], unpack(dead, i, math.min(i + 999, #dead)))
end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
return redis.call('HGETALL', KEYS[1])
"""
)

# KEYS: expiry. ARGV: consumer, ttl_ms. Pushes a registered consumer's expiry on, no more.
_PROLONG = (
    _NOW_MS
    + """
return redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
"""
)

# KEYS: expiry. ARGV: grace_ms, count. Consumers expired over grace_ms ago, left in place.
_EXPIRED = (
    _NOW_MS
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]),
                  'LIMIT', 0, tonumber(ARGV[2]))
"""
)


class Heartbeat:
    """Keeps one consumer in its group's registry while the service runs."""

    def __init__(
        self, redis: Redis, group: str, consumer: str, ttl_s: float, value: Callable[[], bytes]
    ) -> None:
        self.redis = redis
        self.group = group
        self.consumer = consumer
        self.keys = [names.live_values(group), names.live_expiry(group)]
        self.ttl_ms = int(ttl_s * 1000)
        self.value = value
        self.script = redis.register_script(_BEAT)

    async def beat(self) -> None:
        """Say what this consumer serves and that it lives ``ttl_s`` more (one round trip)."""
        await self.script(self.keys, [self.consumer, self.value(), self.ttl_ms])

    async def run(self) -> None:
        """Beat until cancelled: a draining service is still alive and owns its entries."""
        while True:
            try:
                await self.beat()
            except RedisError as exc:
                logger.warning("heartbeat failed: %s", exc)
            await asyncio.sleep(self.ttl_ms / 3000)

    async def stop(self) -> None:
        """Say goodbye at once, so peers need not wait for the TTL."""
        try:
            await forget_consumers(self.redis, self.group, [self.consumer])
        except RedisError as exc:
            logger.warning("could not leave the %s registry: %s", self.group, exc)


def prolong(client: SyncRedis, group: str, consumer: str, ttl_s: float) -> None:
    """From a thread without an event loop: ``consumer`` lives ``ttl_s`` more.

    Only its expiry moves, and only while it is registered: one whose beat already lapsed
    stays dead (peers may have claimed its entries).
    """
    script = client.register_script(_PROLONG)
    script([names.live_expiry(group)], [consumer, int(ttl_s * 1000)])


async def live_consumers(redis: Redis, group: str) -> dict[str, bytes]:
    """Consumer name -> heartbeat value, for every live consumer of ``group``.

    One script call; the consumers it finds expired leave the registry.
    """
    keys = [names.live_values(group), names.live_expiry(group)]
    flat = cast(list[bytes], await redis.register_script(_LIVE)(keys))
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


async def expired_consumers(redis: Redis, group: str, grace_ms: int, count: int) -> list[str]:
    """Up to ``count`` consumers of ``group`` whose beat expired over ``grace_ms`` ago.

    They stay in the registry until :func:`forget_consumers`, so a caller that dies while
    cleaning up after them leaves them for the next one. Meant for a group nobody reads with
    :func:`live_consumers`, which would drop them first.
    """
    script = redis.register_script(_EXPIRED)
    found = cast(list[bytes], await script([names.live_expiry(group)], [grace_ms, count]))
    return [_text(name) for name in found]


async def forget_consumers(redis: Redis, group: str, consumers: list[str]) -> None:
    """Take ``consumers`` out of ``group``'s registry (one transaction)."""
    if not consumers:
        return
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(names.live_values(group), *consumers)
        pipe.zrem(names.live_expiry(group), *consumers)
        await pipe.execute()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
