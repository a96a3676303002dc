"""An event one dispatcher waits on: one future per wait, no task."""

from __future__ import annotations

import asyncio


class Wake:
    """An event a single dispatcher waits on: one future per wait, no task.

    Waiting with ``asyncio.wait`` on the wake and an exit event made and cancelled two
    tasks each time, a quarter of the batcher's CPU per batch at concurrency 1 (413 -> 310
    µs of user time per batch).
    """

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout_s: float | None) -> None:
        """Until set, or ``timeout_s`` passed (None: no limit)."""
        if self._set:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, _settle, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
