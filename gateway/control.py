"""The gateway's side of model control: follow the desired state, route, settle, poll.

One task per gateway process, every ``control_refresh_s``: read which lanes the live workers
serve (the catalog routes by it), apply a new generation of the desired state to the
catalog, and, in modes explicit and poll, open and close versions as their successors
become served (:meth:`~weir.control.controller.Controller.settle`); in mode poll it also
follows the repository's files every ``repository_poll_secs``. Every gateway does all of
it: each step is idempotent, so no gateway is special and any may die.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.catalog import Catalog
from weir import names
from weir.control import uploads
from weir.control.controller import Controller
from weir.control.desired import DesiredState
from weir.control.follower import Follower
from weir.control.mode import ControlMode
from weir.errors import ConfigError
from weir.liveness import live_consumers
from weir.repository import model_dirs
from weir.settings import GatewaySettings
from weir.workload import mesh_view

logger = logging.getLogger(__name__)

# How many refresh periods a new version is served before the one it replaces closes: every
# gateway's view has seen it by then, so none routes a request to a closed version.
SETTLE_PERIODS = 4


class ControlLoop:
    """Keeps the catalog current and, in a control mode, the desired state settled."""

    def __init__(self, settings: GatewaySettings, redis: Redis, catalog: Catalog) -> None:
        self.settings = settings
        self.redis = redis
        self.catalog = catalog
        self.mode = settings.model_control_mode
        self.controller = Controller(
            redis,
            settings.repository,
            settings.completion,
            settle_s=SETTLE_PERIODS * settings.control_refresh_s,
        )
        self.uploads_dir = settings.uploads_dir or uploads.default_dir()
        self.files = uploads.LocalFiles(redis, self.uploads_dir, settings.uploads_keep_s)
        self.follower = Follower(
            self.controller.store,
            settings.control_refresh_s,
            self.apply,
            self.files.localize,
            self.files.tidy,
        )
        self.state = DesiredState()
        self.next_poll = 0.0
        self.changed = asyncio.Event()  # set at each refresh, for the load calls waiting
        self.stopping = False
        # Called after each look at the live workers (the mesh answers what cannot be served).
        self.observers: list[Callable[[], None]] = []

    async def start(self) -> None:
        """Seed the desired state as the mode says, and serve it."""
        if self.mode is ControlMode.NONE:
            return
        if self.mode is ControlMode.EXPLICIT:
            await self._seed(self.settings.load_models)
        else:
            await self.poll()
        await self.apply(await self.follower.first())

    async def _seed(self, names_: list[str]) -> None:
        if names_ == ["*"]:
            names_ = [d.name for d in model_dirs(self.settings.repository.resolve())]
        for name in names_:
            try:
                await self.controller.load(name)
            except ConfigError as exc:
                logger.error("cannot load model %s: %s", name, exc)

    async def poll(self) -> None:
        self.next_poll = time.monotonic() + self.settings.repository_poll_secs
        await self.controller.poll_once()

    async def apply(self, state: DesiredState) -> None:
        try:
            self.catalog.apply(state)
        except ConfigError as exc:  # written by a newer gateway, or a repository moved
            logger.error("cannot serve generation %d: %s", state.generation, exc)
            return
        self.state = state

    async def refresh(self) -> None:
        """One round: the live view, the desired state, and in a control mode its upkeep."""
        self.catalog.observe(mesh_view(await live_consumers(self.redis, names.WORKER_GROUP)))
        for observer in self.observers:
            observer()
        if self.mode is ControlMode.NONE:
            return
        await self.follower.check()
        if self.mode is ControlMode.POLL and time.monotonic() >= self.next_poll:
            await self.poll()
        await self.controller.settle(self.state, self.catalog.view)

    def stop(self) -> None:
        self.stopping = True

    async def run(self) -> None:
        """Refresh until stopped (or cancelled)."""
        while not self.stopping:
            try:
                await self.refresh()
            except RedisError as exc:
                logger.warning("model control: Redis unreachable: %s", exc)
            except Exception:
                logger.exception("model control round failed")
            self.changed.set()
            self.changed = asyncio.Event()
            await asyncio.sleep(self.settings.control_refresh_s)

    async def next_round(self, timeout_s: float) -> None:
        """Wait for the next refresh (at most ``timeout_s``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout_s)
