"""Loading a lane's instances within the model's load timeout.

A lane's instances load, and warm up, in a thread of their own while the worker's event loop
serves its other lanes. A load that never ends (an ``initialize`` that waits for something
that never comes, a download that hangs) would hold that thread, and whatever it locked, for
good: its version would stay LOADING, a load request would wait out the gateway's limit, and
nobody would be told why. So a load may take at most the model's load timeout: its
``load_timeout_s`` parameter, else the worker's ``WEIR_WORKER_LOAD_TIMEOUT_S`` (0: no limit).
A TorchServe archive's is its ``startupTimeout`` (120 s by default), which the model store
writes into the parameter.

Past it the worker reports the load failed, with the limit in the reason, as it reports any
failed load: a load request answers with it and the index shows it. Python cannot stop a
thread, and the load may hold a lock other loads need (an archive's import lock), so the
worker then exits, for its supervisor to start a fresh one (:func:`workers.stall.exit_stuck`).
Before it exits it records the failure in Redis for that load attempt
(:class:`TimedOutLoads`): the fresh worker reports it again instead of hanging on the same load
and exiting in turn, until the model is loaded again (a new attempt) or its config changes.

Time spent installing an archive's requirements does not count (:func:`uncounted`), as
TorchServe installs them before its worker starts and its startup timeout runs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

from redis.asyncio import Redis

from weir import names
from weir.config import ModelConfig
from weir.config_parameters import LOAD_TIMEOUT_S, seconds_or_none

T = TypeVar("T")

KEEP_S = 7 * 24 * 3600  # how long Redis keeps a timed-out load's record
_POLL_S = 0.5  # how often a wait looks again while uncounted time runs
_current = threading.local()  # the LoadClock of the load this thread runs, if any


class LoadTimedOut(Exception):
    """A load ran past its timeout, here (``fresh``) or in a worker before this one."""

    def __init__(self, reason: str, fresh: bool = True) -> None:
        super().__init__(reason)
        self.fresh = fresh


def load_timeout(config: ModelConfig, default_s: float) -> float | None:
    """The model's load timeout in seconds; None: no limit."""
    return seconds_or_none(config.parameters, LOAD_TIMEOUT_S) or default_s or None


class LoadClock:
    """A load's time so far, less the time it spent in :func:`uncounted` steps."""

    def __init__(self) -> None:
        self.started_s = time.monotonic()
        self.paused_since_s: float | None = None
        self.paused_s = 0.0
        self._lock = threading.Lock()

    def counted_s(self) -> float:
        now = time.monotonic()
        with self._lock:
            paused = self.paused_s + (
                now - self.paused_since_s if self.paused_since_s is not None else 0.0
            )
        return now - self.started_s - paused

    @property
    def paused(self) -> bool:
        return self.paused_since_s is not None

    @contextmanager
    def pause(self) -> Iterator[None]:
        with self._lock:
            self.paused_since_s = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.paused_s += time.monotonic() - (self.paused_since_s or 0.0)
                self.paused_since_s = None


@contextmanager
def uncounted() -> Iterator[None]:
    """A step of the load this thread runs that its timeout does not count."""
    clock: LoadClock | None = getattr(_current, "clock", None)
    if clock is None or clock.paused:
        yield
        return
    with clock.pause():
        yield


async def load_within(build: Callable[[], T], timeout_s: float | None, what: str) -> T:
    """``build()``'s result, run in a thread of its own, within ``timeout_s`` of counted time.

    Raises:
        LoadTimedOut: ``build`` still runs past the timeout (its thread is left to it).
        Exception: What ``build`` raised.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    clock = LoadClock()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(result)  # type: ignore[arg-type]
        else:
            done.set_exception(error)

    def run() -> None:
        _current.clock = clock
        result: T | None = None
        error: BaseException | None = None
        try:
            result = build()
        except BaseException as exc:  # handed to the awaiting task, whatever it is
            error = exc
        with suppress(RuntimeError):  # a closed loop: the worker is gone or going
            loop.call_soon_threadsafe(settle, result, error)

    # A daemon thread: a load still running cannot hold the process's exit.
    threading.Thread(target=run, name=f"load {what}", daemon=True).start()
    while True:
        left_s = None if timeout_s is None else timeout_s - clock.counted_s()
        if left_s is not None and left_s <= 0 and not clock.paused:
            raise LoadTimedOut(f"did not finish loading within its load timeout ({timeout_s:g} s)")
        wait_s = None if left_s is None else max(left_s, _POLL_S)
        try:
            return await asyncio.wait_for(asyncio.shield(done), wait_s)
        except TimeoutError:
            continue


class TimedOutLoads:
    """The loads of one pool that ran past their timeout, per model version and attempt.

    Every attempt is kept, not only the last: a load asked again that fails is undone, which
    puts the version back at its earlier attempt, and that one timed out too.
    """

    def __init__(self, redis: Redis, pool: str) -> None:
        self.redis = redis
        self.pool = pool

    async def record(self, model: str, version: str, attempt: str, reason: str) -> None:
        key = names.timed_out_load(model, version, self.pool)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, attempt, reason)
            pipe.expire(key, KEEP_S)
            await pipe.execute()

    async def reason(self, model: str, version: str, attempt: str) -> str | None:
        """Why this attempt's load timed out in an earlier worker; None if it did not."""
        raw = await self.redis.hget(names.timed_out_load(model, version, self.pool), attempt)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)
