"""Which (model, version) pairs a live worker serves, from the workers' heartbeat keys."""

from __future__ import annotations

from typing import cast

import msgpack
from redis.asyncio import Redis

from weir import names


async def served_models(redis: Redis) -> set[tuple[str, str]]:
    """Every (model, version) named by a heartbeat key that has not expired."""
    keys = [key async for key in redis.scan_iter(match=names.worker_heartbeat_pattern(), count=100)]
    if not keys:
        return set()
    served: set[tuple[str, str]] = set()
    for value in await redis.mget(keys):
        if value is not None:
            served.update((str(m), str(v)) for m, v in msgpack.unpackb(cast(bytes, value)))
    return served
