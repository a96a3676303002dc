"""Following the desired state: each service polls its generation and applies what changed.

Also the test every service makes before it drops a lane the desired state no longer names:
the version admits nothing any more (:func:`weir.names.serving_versions`) and every request
it accepted was answered (its queued counter), or it has waited ``retire_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names
from weir.control.desired import DesiredState, DesiredStore

logger = logging.getLogger(__name__)

Apply = Callable[[DesiredState], Awaitable[None]]
Prepare = Callable[[DesiredState], Awaitable[DesiredState]]
Tidy = Callable[[], Awaitable[None]]


class Follower:
    """Calls ``apply`` with each new generation of the desired state."""

    def __init__(
        self,
        store: DesiredStore,
        interval_s: float,
        apply: Apply,
        prepare: Prepare | None = None,
        tidy: Tidy | None = None,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.apply = apply
        self.prepare = prepare  # e.g. write the files of uploaded models here
        self.tidy = tidy  # e.g. remove those no model uses; called at each check
        self.generation: int | None = None

    async def first(self) -> DesiredState:
        """The desired state at start (empty when none was ever written)."""
        state = await self.store.read() or DesiredState()
        self.generation = state.generation
        return state if self.prepare is None else await self.prepare(state)

    async def check(self) -> None:
        """Apply the desired state if its generation moved."""
        if self.tidy is not None:
            await self.tidy()
        generation = await self.store.generation()
        if generation is None or generation == self.generation:
            return  # a Redis that lost its data keeps what is served, not nothing
        state = await self.store.read()
        if state is None:
            return
        if self.prepare is not None:
            state = await self.prepare(state)
        await self.apply(state)
        self.generation = state.generation

    async def run(self, should_exit: asyncio.Event) -> None:
        while not should_exit.is_set():
            try:
                await self.check()
            except RedisError as exc:
                logger.warning("reading the desired state failed, retrying: %s", exc)
            except Exception:
                logger.exception("applying the desired state failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(should_exit.wait(), self.interval_s)


class Retirement:
    """When a lane that is no longer desired may go: drained, or waited long enough."""

    def __init__(self, redis: Redis, timeout_s: float) -> None:
        self.redis = redis
        self.timeout_s = timeout_s
        self.since: dict[tuple[str, str], float] = {}

    async def may_go(self, model: str, version: str) -> bool:
        key = (model, version)
        started = self.since.setdefault(key, time.monotonic())
        if time.monotonic() - started >= self.timeout_s:
            return True
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.sismember(names.serving_versions(model), version)
            pipe.get(names.queued_counter(model, version))
            admitting, queued = await pipe.execute()
        return not admitting and int(queued or 0) <= 0

    def forget(self, model: str, version: str) -> None:
        """The lane is desired again (or gone): its clock starts anew next time."""
        self.since.pop((model, version), None)
