"""Readiness read once and shared: what a burst of probes costs is one Redis round trip.

Load balancers, orchestrators and clients probe readiness often and at once. Every probe
that arrives while a read of the live workers runs waits for that read, and every probe
within ``max_age_s`` of its start takes its result, so thousands of concurrent probes cost
one script call. A new desired-state generation (a model loaded or unloaded) makes the next
probe read again, so a load that has just returned is seen at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

Served = set[tuple[str, str]]


class ReadinessCache:
    """The last read of the served (model, version) pairs, shared by the probes that ask.

    Callers share the set it returns: they read it and never change it.
    """

    def __init__(self) -> None:
        self._read: asyncio.Task[Served] | None = None
        self._started_s = 0.0
        self._generation = -1

    async def get(
        self, read: Callable[[], Coroutine[Any, Any, Served]], max_age_s: float, generation: int
    ) -> Served:
        """The served pairs, from a read begun under ``max_age_s`` ago or a new one."""
        if self._read is None or self._stale(self._read, max_age_s, generation):
            self._read = asyncio.create_task(read(), name="readiness read")
            self._read.add_done_callback(_retrieve)
            self._started_s = time.monotonic()
            self._generation = generation
        # Shielded: a probe whose client leaves must not cancel the read the others await.
        return await asyncio.shield(self._read)

    def forget(self) -> None:
        """The next probe reads again: the caller saw the served models change."""
        self._generation = -1

    def _stale(self, read: asyncio.Task[Served], max_age_s: float, generation: int) -> bool:
        if generation != self._generation:
            return True
        return read.done() and time.monotonic() - self._started_s >= max_age_s


def _retrieve(task: asyncio.Task[Served]) -> None:
    # Every waiter may have left (their probes cancelled): a failed read is still retrieved.
    if not task.cancelled():
        task.exception()
