"""Which (model, version) pairs a live worker serves, from the workers' heartbeat keys."""

from __future__ import annotations

from redis.asyncio import Redis

from weir import names
from weir.liveness import live_consumers
from weir.workload import served_instances


async def served_models(redis: Redis) -> set[tuple[str, str]]:
    """Every (model, version) that at least one live worker runs an instance of."""
    instances = served_instances(await live_consumers(redis, names.WORKER_GROUP))
    return {key for key, count in instances.items() if count > 0}
