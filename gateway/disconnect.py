"""A connection's end, which the requests waiting on it follow.

uvicorn tells an app that its client left only through ``receive()``, which an inference
waiting for its reply is not reading. The gateway's HTTP protocol
(:mod:`gateway.http_protocol`) puts one :class:`Disconnect` per connection in each request's
scope under :data:`SCOPE_KEY`; an inference follows it while it waits, and when the
connection is lost its task is cancelled, so the gateway tells the mesh at once
(:mod:`gateway.cancels`) instead of computing an answer nobody reads.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, MutableMapping
from typing import Any, TypeVar

from weir.errors import Canceled

SCOPE_KEY = "weir.disconnect"
T = TypeVar("T")


class Disconnect:
    """Whether one connection is lost, and the tasks to cancel when it is."""

    __slots__ = ("_tasks", "lost")

    def __init__(self) -> None:
        self.lost = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def fire(self) -> None:
        """The connection is gone: cancel every task that follows it."""
        self.lost = True
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()

    async def follow(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``; Canceled if the connection is lost meanwhile."""
        task = asyncio.current_task()
        if self.lost:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # never started: nothing to cancel
            raise Canceled("the client closed the connection before the request was queued")
        if task is None:
            return await awaitable
        self._tasks.add(task)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if not self.lost:
                raise
            task.uncancel()  # this cancellation was ours; the task goes on to answer
            raise Canceled("the client closed the connection before its answer") from None
        finally:
            self._tasks.discard(task)


async def follow(scope: MutableMapping[str, Any], awaitable: Awaitable[T]) -> T:
    """``awaitable``, cancelled when the scope's connection is lost (if it can tell)."""
    disconnect: Disconnect | None = scope.get(SCOPE_KEY)
    if disconnect is None:
        return await awaitable
    return await disconnect.follow(awaitable)
