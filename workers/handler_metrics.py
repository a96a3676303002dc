"""Publishing what a worker's TorchServe handlers recorded, for the gateway's metrics port.

Every ``handler_metrics_interval_s`` the worker gathers the series of every instance it runs
(:meth:`~workers.backends.base.ModelBackend.handler_samples`: TorchServe archives record
``PredictionTime`` for each batch, ``BaseHandler`` its ``HandlerTime``, a handler whatever it
names), merges the instances of one model, adds ``Hostname`` as TorchServe's backend does,
and rewrites its hash (:func:`weir.names.handler_metrics`) with a TTL of three intervals.
A worker without archives writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import replace

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names
from weir.handler_metrics import HandlerSample, encode, merge
from workers.backends.base import ModelBackend

logger = logging.getLogger(__name__)

TTL_INTERVALS = 3  # the series outlive two missed rewrites
HOSTNAME = "Hostname"


class HandlerMetricsPublisher:
    """Rewrites one worker's hash of handler series every ``interval_s``."""

    def __init__(
        self,
        redis: Redis,
        worker_id: str,
        interval_s: float,
        backends: Callable[[], Iterable[ModelBackend]],
        hostname: str | None = None,
    ) -> None:
        self.redis = redis
        self.key = names.handler_metrics(worker_id)
        self.interval_s = interval_s
        self.backends = backends
        self.hostname = hostname or socket.gethostname()
        self.published = False

    async def run(self, should_exit: asyncio.Event) -> None:
        while not should_exit.is_set():
            await self.publish_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(should_exit.wait(), self.interval_s)

    def samples(self) -> list[HandlerSample]:
        """The worker's series now, its instances merged, each with ``Hostname``."""
        host = (HOSTNAME, self.hostname)
        found = merge(s for backend in self.backends() for s in backend.handler_samples())
        return [replace(s, labels=(*s.labels, host)) for s in found]

    async def publish_once(self) -> None:
        """Rewrite the hash; a failure is logged and the next interval tries again."""
        samples = self.samples()
        if not samples and not self.published:
            return
        ttl_ms = max(int(self.interval_s * TTL_INTERVALS * 1000), 1)
        flat = [item for pair in encode(samples).items() for item in pair]
        try:
            await self.redis.register_script(_REWRITE)([self.key], [ttl_ms, *flat])
            self.published = bool(samples)
        except RedisError as exc:
            logger.warning("could not publish the handlers' metrics: %s", exc)


# KEYS: the hash. ARGV: ttl_ms, field, value, ... One script, so that a scrape never sees the
# hash half written (a counter would seem to fall back). HSET in slices: Lua's unpack has a
# stack limit.
_REWRITE = """
redis.call('DEL', KEYS[1])
for i = 2, #ARGV, 1000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if #ARGV > 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
"""
