"""A gateway's reply stream kept in being while the gateway lives, and dead gateways' removed.

Workers and batchers write replies with ``XADD ... NOMKSTREAM``: a reply never creates a
stream, so the stream of a gateway that stopped (and deleted it) stays gone however late a
reply comes. The gateway therefore creates its own stream, at start and again on every
beat (cheap: one script that does nothing while the stream exists), which also brings it
back after a Redis that restarted without its data.

Gateways heartbeat in the ``gateways`` liveness registry (:mod:`weir.liveness`). A gateway
killed without its shutdown leaves its stream behind; the live gateways find it in the
registry expired for longer than a grace and delete its stream, then its registry entry.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names
from weir.liveness import Heartbeat, expired_consumers, forget_consumers
from weir.stages import ENSURE_SCRIPT

logger = logging.getLogger(__name__)


SWEEP_COUNT = 100  # dead gateways cleaned up per sweep; the next sweep takes more


class ReplyStreams:
    """Keeps one gateway's reply stream and liveness; removes dead gateways' streams."""

    def __init__(self, redis: Redis, gateway_id: str, ttl_s: float) -> None:
        self.redis = redis
        self.gateway_id = gateway_id
        self.stream = names.reply_stream(gateway_id)
        self.heartbeat = Heartbeat(redis, names.GATEWAY_GROUP, gateway_id, ttl_s, bytes)
        self.interval_s = ttl_s / 3
        # A gateway whose beats merely stalled gets a whole TTL more before peers clean up
        # after it (and if it lives, its next beat makes its stream again).
        self.grace_ms = int(ttl_s * 1000)
        self.ensure = redis.register_script(ENSURE_SCRIPT)

    async def start(self) -> None:
        """Make the stream before the gateway takes a request; :meth:`run` retries a failure."""
        try:
            await self.keep()
        except RedisError as exc:
            logger.warning("cannot create reply stream %s yet: %s", self.stream, exc)

    async def keep(self) -> None:
        """Create the stream if it is missing, and beat."""
        await self.ensure([self.stream])
        await self.heartbeat.beat()

    async def run(self) -> None:
        """Keep the stream and sweep until cancelled."""
        while True:
            try:
                await self.keep()
                await self.sweep()
            except RedisError as exc:
                logger.warning("keeping reply stream %s failed: %s", self.stream, exc)
            await asyncio.sleep(self.interval_s)

    async def sweep(self) -> int:
        """Delete the reply streams of dead gateways; how many there were."""
        grace_ms = self.grace_ms
        dead = await expired_consumers(self.redis, names.GATEWAY_GROUP, grace_ms, SWEEP_COUNT)
        if not dead:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for gateway_id in dead:  # one DEL each: the streams lie on different cluster slots
                pipe.delete(names.reply_stream(gateway_id))
            await pipe.execute()
        # Only now: a sweeper that dies before this leaves them for the next sweep.
        await forget_consumers(self.redis, names.GATEWAY_GROUP, dead)
        logger.info("removed the reply streams of %d dead gateways", len(dead))
        return len(dead)

    async def stop(self) -> None:
        """Leave the registry (the stream itself is deleted by the mesh client's close)."""
        await self.heartbeat.stop()
