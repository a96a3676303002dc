"""Liveness of consumers: a key with a TTL that each live consumer keeps refreshing.

Workers put what they serve in the value (``[[model, version, instances], ...]``) so the
gateway can tell whether a model is ready and the batcher how many instances a lane has.
A consumer whose key expired is dead: its pending entries may be claimed by the living.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names

logger = logging.getLogger(__name__)


class Heartbeat:
    """Keeps one consumer's live key set while the service runs."""

    def __init__(
        self, redis: Redis, group: str, consumer: str, ttl_s: float, value: Callable[[], bytes]
    ) -> None:
        self.redis = redis
        self.key = names.live_key(group, consumer)
        self.ttl_ms = int(ttl_s * 1000)
        self.value = value

    async def beat(self) -> None:
        await self.redis.set(self.key, self.value(), px=self.ttl_ms)

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
            await self.redis.delete(self.key)
        except RedisError as exc:
            logger.warning("could not remove live key %s: %s", self.key, exc)


async def live_consumers(redis: Redis, group: str) -> dict[str, bytes]:
    """Consumer name -> heartbeat value, for every live consumer of ``group``."""
    prefix = names.live_key(group, "")
    keys = [key async for key in redis.scan_iter(match=names.live_pattern(group), count=200)]
    if not keys:
        return {}
    values = await redis.mget(keys)
    return {
        _text(key).removeprefix(prefix): cast(bytes, value)
        for key, value in zip(keys, values, strict=True)
        if value is not None
    }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
