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
        try:
            pipe = self.redis.pipeline(transaction=True)  # one key: readers never see it half
            pipe.delete(self.key)
            if samples:
                pipe.hset(self.key, mapping=encode(samples))  # type: ignore[arg-type]
                pipe.pexpire(self.key, max(int(self.interval_s * TTL_INTERVALS * 1000), 1))
            await pipe.execute()
            self.published = bool(samples)
        except RedisError as exc:
            logger.warning("could not publish the handlers' metrics: %s", exc)
