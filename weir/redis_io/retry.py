"""How long to wait before trying a failed Redis step again: one policy for every service.

redis-py retries a single command on a dropped connection (:mod:`weir.redis_io.connection`); a
service loop (reading requests or batches, sending a batch, writing replies, reading
replies or cancel notices) retries its whole step. Both back off alike: redis-py's
:class:`~redis.backoff.EqualJitterBackoff`, from ``BASE_S`` doubling up to ``CAP_S``, half
of each wait random, so processes that lost Redis together do not return in step, a blip
costs tens of milliseconds and an outage is retried about once a second.
"""

from __future__ import annotations

import asyncio

from redis.backoff import AbstractBackoff, EqualJitterBackoff

BASE_S = 0.05
CAP_S = 1.0


def backoff() -> AbstractBackoff:
    """The backoff of every Redis retry in Weir."""
    return EqualJitterBackoff(cap=CAP_S, base=BASE_S)


class RetryWait:
    """The wait before a loop's next attempt: longer after each failure, reset by a success."""

    def __init__(self) -> None:
        self._backoff = backoff()
        self.failures = 0

    def succeeded(self) -> None:
        self.failures = 0

    async def failed(self) -> None:
        """Count a failure and wait before the next attempt."""
        self.failures += 1
        await asyncio.sleep(self._backoff.compute(self.failures))
