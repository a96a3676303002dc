"""The skeleton every long-running service shares: startup -> run -> shutdown.

SIGTERM or SIGINT sets ``should_exit``; the service stops taking work, drains what it holds
for up to ``shutdown_grace_s`` and then cancels the rest. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any

logger = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RECANCEL_S = 0.1  # how often TaskSet.cancel_all cancels again a task that did not end
# The exit status of a service that ends itself for a fresh one to take its place: work it can
# neither stop nor wait for (a batch or a load past its limit) still runs in a thread.
# sysexits' EX_TEMPFAIL, "try again"; not 3, which uvicorn exits with when it cannot start.
EXIT_REPLACE = 75


class TaskSet:
    """Holds every task a service spawns, so none is garbage-collected or forgotten."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("task %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel_all(self, timeout_s: float) -> None:
        """Cancel every task and wait for them, at most ``timeout_s``.

        A task still running is cancelled again every ``RECANCEL_S``: on Python 3.11
        ``asyncio.wait_for`` drops a cancellation that arrives as the call it waits on
        completes (CPython gh-86296), and redis-py sends every command through it, so a loop
        around Redis calls can survive one ``cancel()`` and run on.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = set(self._tasks)
        while pending:
            for task in pending:
                task.cancel()
            left = deadline - loop.time()
            if left <= 0:
                return
            _, pending = await asyncio.wait(pending, timeout=min(left, RECANCEL_S))


class Service(ABC):
    """A long-running service: subclasses fill in the three phases."""

    name = "service"

    def __init__(self, shutdown_grace_s: float) -> None:
        self.shutdown_grace_s = shutdown_grace_s
        self.should_exit = asyncio.Event()
        self._signals = 0

    @abstractmethod
    async def startup(self) -> None:
        """Connect, create groups, load models."""

    @abstractmethod
    async def run(self) -> None:
        """Work until ``should_exit`` is set, then drain."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Release resources; runs once, after ``run`` ends or fails."""

    def handle_exit(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("%s: second %s, exiting now", self.name, sig.name)
            os._exit(1)
        logger.info("%s: %s received, draining", self.name, sig.name)
        self.should_exit.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in HANDLED_SIGNALS:
            loop.add_signal_handler(sig, self.handle_exit, sig)
        try:
            await self.startup()
            # What startup built (models, configs, modules) lives as long as the service:
            # out of the collector's sight, a full collection no longer walks it all, which
            # on a worker holding torch took tens of milliseconds in the middle of traffic.
            gc.freeze()
            try:
                await self.run()
            finally:
                await self.shutdown()
        finally:
            for sig in HANDLED_SIGNALS:
                loop.remove_signal_handler(sig)


def run(service: Service) -> None:
    """Run ``service`` to completion on uvloop when it is installed, else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(service.serve())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(service.serve())
