"""A worker pool process: loads the models its pool serves and runs their batches.

A model belongs to the pools its ``instance_group`` kinds name, which place its instances
(:mod:`workers.placement`). Each lane (model, version) gets its instances and their executor
threads (:mod:`workers.lane_run`). The worker heartbeats with a TTL key listing what it
serves and which loads failed. On SIGTERM it stops reading, finishes and acks the batches it
took, and exits.

In mode none the lanes load at start, and a model that cannot load stops the worker. In a
model control mode they follow the desired state (:mod:`weir.control`): a lane loads in a
thread while the others serve, warms up (``model_warmup``), and only then reads; a new config
replaces a lane once the new one is warm (the old one finishing what it took); a failed load
is reported and leaves the old lane serving; a lane no longer desired serves until its
version admits nothing and its accepted requests are answered, then gives its memory back.
A load that runs past the model's load timeout is reported failed and ends the worker, for a
fresh one (:mod:`workers.loading`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
from functools import partial

from redis.exceptions import RedisError

from pipelines.graph import load_pipelines
from pipelines.route import Router
from weir import names, wire
from weir.cancels import CancelWatch
from weir.control import uploads
from weir.control.desired import DesiredState, DesiredStore
from weir.control.follower import Follower, Retirement
from weir.control.mode import ControlMode
from weir.errors import ConfigError
from weir.liveness import Heartbeat
from weir.log_settings import LogControl
from weir.redis_io.connection import connect
from weir.redis_io.links import open_link
from weir.repository import ModelEntry, Repository
from weir.service import Service, TaskSet
from weir.settings import WorkerSettings
from weir.streams import StreamGroup
from weir.trim import Trimmer
from weir.workload import encode_served
from workers import bls
from workers.backends import ArchiveOptions, load_backend
from workers.backends.base import ModelBackend
from workers.bls import BlsClient
from workers.execution import BatchRunner
from workers.gpu_metrics import GpuSampler
from workers.handler_metrics import HandlerMetricsPublisher
from workers.lane import WorkerLane
from workers.lane_run import LaneRun
from workers.loading import LoadTimedOut, TimedOutLoads, load_timeout, load_within
from workers.memory import IdleTrim, limit_arenas, malloc_trim
from workers.placement import POOL_KINDS, instance_count, place
from workers.stall import StallGuard, exit_stuck
from workers.threads import ThreadShare
from workers.warmup import run_warmup

logger = logging.getLogger(__name__)

FAILURE_CHARS = 500  # of a load's error, in the heartbeat and the repository index

LaneKey = tuple[str, str]


class Worker(Service):
    """Serves every model of one pool that the repository or the desired state names."""

    name = "worker"

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__(settings.shutdown_grace_s)
        self.settings = settings
        self.worker_id = f"{settings.pool}-{settings.name or uuid.uuid4().hex[:12]}"
        self.redis = connect(settings.redis_url, retries=settings.redis_retries)
        self.group = StreamGroup(self.redis, names.WORKER_GROUP, self.worker_id)
        self.link = open_link(
            settings.redis_url, settings.redis_timeout_s
        )  # the lanes' transactions (see weir.redis_io.link)
        self.runs: dict[LaneKey, LaneRun] = {}
        self.bls = bls.CLIENT = BlsClient(settings, self.worker_id, self.link)  # model calls
        self.loading: dict[LaneKey, str] = {}  # lanes loading, with the stamp they load
        self.failed: dict[tuple[str, str, str], str] = {}
        self.retiring: set[LaneKey] = set()
        self.wanted: dict[LaneKey, str] = {}  # the lanes the desired state names, by stamp
        self.retirement = Retirement(self.redis, settings.retire_timeout_s)
        self.router = Router(self.redis, {})
        self.tasks = TaskSet()
        self.started = False
        # The worker's threads (every backend's), shared out among the batches computing.
        self.threads = ThreadShare(settings.torch_threads)
        self.timed_out = TimedOutLoads(self.redis, settings.pool)
        self.heartbeat = Heartbeat(
            self.redis, names.WORKER_GROUP, self.worker_id, settings.heartbeat_ttl_s, self._served
        )
        self.stall = StallGuard(
            settings.redis_url,
            names.WORKER_GROUP,
            self.worker_id,
            settings.heartbeat_ttl_s,
            settings.inline_stall_s,
        )
        self.trimmer = Trimmer(self.redis, names.WORKER_GROUP, [])
        self.cancels = CancelWatch(settings.redis_url, settings.redis_timeout_s, settings.block_ms)
        self.files = uploads.LocalFiles(
            self.redis, settings.uploads_dir or uploads.default_dir(), settings.uploads_keep_s
        )
        self.follower = Follower(
            DesiredStore(self.redis),
            settings.control_refresh_s,
            self._follow,
            self.files.localize,
            self.files.tidy,
        )

    @property
    def lanes(self) -> list[WorkerLane]:
        return [run.lane for run in self.runs.values()]

    @property
    def control(self) -> bool:
        return self.settings.model_control_mode is not ControlMode.NONE

    def _served(self) -> bytes:
        served = [(k[0], k[1], len(r.lane.runners), r.lane.stamp) for k, r in self.runs.items()]
        failed = [(*key, reason) for key, reason in self.failed.items()]
        return encode_served(served, failed)

    async def startup(self) -> None:
        if self.settings.pool not in POOL_KINDS:
            raise ValueError(
                f"unknown pool {self.settings.pool!r}; expected one of {sorted(POOL_KINDS)}"
            )
        limit_arenas()  # before any instance thread allocates
        self._configure_torch()
        if self.control:
            await self._follow(await self.follower.first())
        else:
            await self._load_all(
                Repository.load(self.settings.repository, self.settings.completion)
            )
        await self.heartbeat.beat()

    async def _load_all(self, repository: Repository) -> None:
        """Mode none: every lane of this pool, before serving; a failure stops the worker."""
        self.router = Router(self.redis, load_pipelines(repository))
        self.bls.repository = repository
        for entry in repository:
            count = instance_count(entry.config, self.settings.pool)
            for version in entry.versions if count else ():
                try:
                    runners = await self._load_runners(entry, version)
                except LoadTimedOut as exc:
                    raise ConfigError(f"model '{entry.name}' version {version}: {exc}") from None
                await self._start(self._lane(entry, version, runners))
        logger.info(
            "worker %s serving %s",
            self.worker_id,
            ", ".join(run.lane.label for run in self.runs.values()) or "nothing",
        )

    def _lane(self, entry: ModelEntry, version: str, runners: list[BatchRunner]) -> WorkerLane:
        return WorkerLane(
            self.link, self.group, entry, version, runners, self.settings, self.router, self.stall
        )

    def _configure_torch(self) -> None:
        if self.settings.torch_threads:
            import torch

            torch.set_num_threads(self.settings.torch_threads)

    def _build(self, entry: ModelEntry, version: str) -> list[BatchRunner]:
        """Load a lane's instances and warm each up (blocking: a thread's work).

        ConfigError first when this pool cannot place them (no CUDA device, say).
        """
        config = entry.config.run_config()  # a sequence model's controls and states too
        placed = place(config, self.settings.pool)
        path = entry.version_path(version)
        archives = ArchiveOptions(
            self.settings.ts_install_requirements, self.settings.ts_decode_input_request
        )
        loaded: dict[int | None, ModelBackend] = {}  # a shareable model, once per device
        backends: list[ModelBackend] = []
        for placement in placed:
            shared = loaded.get(placement.device)
            if shared is None or not shared.shareable:
                on_device = sum(p.device == placement.device for p in placed)
                shared = load_backend(
                    config, path, self.threads, on_device, archives, placement.device
                )
                loaded.setdefault(placement.device, shared)
            backends.append(shared.instance())
        runners = [
            BatchRunner(config, backend, self.settings.isolation_runs) for backend in backends
        ]
        for runner in runners:
            run_warmup(entry.config, runner, entry.path)
        return runners

    async def _load_runners(self, entry: ModelEntry, version: str) -> list[BatchRunner]:
        """A lane's runners, built within the model's load timeout (:mod:`workers.loading`).

        Raises:
            LoadTimedOut: The load ran past its timeout, here or in an earlier worker.
        """
        if self.control:
            earlier = await self.timed_out.reason(entry.name, version, entry.failure_stamp(version))
            if earlier is not None:
                raise LoadTimedOut(earlier, fresh=False)
        limit_s = load_timeout(entry.config, self.settings.load_timeout_s)
        build = partial(self._build, entry, version)
        return await load_within(build, limit_s, f"{entry.name}:{version}")

    async def _start(self, lane: WorkerLane) -> None:
        """Start reading a lane's batch stream, replacing the lane it supersedes."""
        key = (lane.entry.name, lane.version)
        old = self.runs.pop(key, None)
        if old is not None:
            await old.end(self.settings.block_ms / 1000 + 1, self.shutdown_grace_s)
        await self.group.ensure([lane.stream])
        lane.is_canceled = self.cancels.is_canceled
        run = LaneRun(lane)
        self.runs[key] = run
        if self.started:
            run.start(self.tasks)
        await self.redis.xadd(lane.credit_stream, {wire.CREDITS: len(lane.runners)})
        self._watch()

    def _watch(self) -> None:
        """Trim the batch streams of the lanes there are now; watch their cancel notices."""
        self.trimmer.streams = [run.lane.stream for run in self.runs.values()]
        self.cancels.watch([run.lane.cancel_stream for run in self.runs.values()])

    async def _follow(self, state: DesiredState) -> None:
        """Reconcile the lanes with the desired state."""
        try:
            repository = state.repository(self.settings.repository.resolve())
        except ConfigError as exc:
            logger.error("cannot serve generation %d: %s", state.generation, exc)
            return
        self.router = Router(self.redis, load_pipelines(repository))
        self.bls.repository = repository
        wanted = self.wanted = {}
        failures: dict[LaneKey, str] = {}
        for entry in repository:
            count = instance_count(entry.config, self.settings.pool)
            for version in entry.versions if count else ():
                wanted[(entry.name, version)] = entry.stamp(version)
                failures[(entry.name, version)] = entry.failure_stamp(version)
                self._ensure(entry, version, count)
        for run in self.runs.values():
            run.lane.router = self.router
        self.retiring = set(self.runs) - set(wanted)
        for key in wanted:
            self.retirement.forget(*key)
        self.failed = {k: v for k, v in self.failed.items() if failures.get(k[:2]) == k[2]}

    def _ensure(self, entry: ModelEntry, version: str, count: int) -> None:
        """Load the lane in the background unless it runs, loads or failed with this stamp."""
        key, stamp = (entry.name, version), entry.stamp(version)
        run = self.runs.get(key)
        if run is not None and run.lane.stamp == stamp:
            return
        if self.loading.get(key) == stamp or (*key, entry.failure_stamp(version)) in self.failed:
            return
        self.loading[key] = stamp
        self.tasks.spawn(self._load(entry, version, count), f"load {entry.name}:{version}")

    async def _load(self, entry: ModelEntry, version: str, count: int) -> None:
        key, stamp = (entry.name, version), entry.stamp(version)
        attempt = entry.failure_stamp(version)
        try:
            runners = await self._load_runners(entry, version)
        except Exception as exc:
            plain = isinstance(exc, ConfigError | LoadTimedOut)
            reason = str(exc) if plain else f"{type(exc).__name__}: {exc}"
            logger.error("cannot load %s:%s: %s", entry.name, version, reason)
            self.failed[(*key, attempt)] = reason[:FAILURE_CHARS]
            if isinstance(exc, LoadTimedOut) and exc.fresh:
                await self._give_up(entry.name, version, attempt, reason)
            await self.heartbeat.beat()
            return
        finally:
            if self.loading.get(key) == stamp:
                del self.loading[key]
        if self.wanted.get(key) != stamp:  # unloaded, or a newer config came meanwhile
            logger.info("lane %s:%s loaded but no longer wanted", entry.name, version)
            return
        await self._start(self._lane(entry, version, runners))
        await self.heartbeat.beat()  # advertise it at once
        logger.info("lane %s:%s serving with %d instances", entry.name, version, count)

    async def _give_up(self, model: str, version: str, attempt: str, reason: str) -> None:
        """Report a load still running past its timeout, record it, and end the worker."""
        try:
            await self.heartbeat.beat()
            await self.timed_out.record(model, version, attempt, reason)
        except RedisError as exc:
            logger.error(
                "could not report the load of %s:%s that timed out: %s", model, version, exc
            )
        told = "the load was reported failed"
        exit_stuck(f"loading {model}:{version} ran past its load timeout", told)

    async def _retire(self) -> None:
        """Stop the lanes no longer desired once drained, and give their memory back."""
        while not self.should_exit.is_set():
            for key in sorted(self.retiring):
                try:
                    if key in self.runs and await self.retirement.may_go(*key):
                        self.retiring.discard(key)
                        await self._stop_lane(key)
                except RedisError as exc:
                    logger.warning("retiring %s:%s waits for Redis: %s", *key, exc)
            await asyncio.sleep(self.settings.control_refresh_s)

    async def _stop_lane(self, key: LaneKey) -> None:
        run = self.runs.pop(key)
        await run.end(self.settings.block_ms / 1000 + 1, self.shutdown_grace_s)
        self.retirement.forget(*key)
        self._watch()
        await self.heartbeat.beat()
        del run
        _give_memory_back()
        logger.info("lane %s:%s unloaded", *key)

    async def run(self) -> None:
        self.started = True
        for run in self.runs.values():
            run.start(self.tasks)
        self.tasks.spawn(self.heartbeat.run(), "heartbeat")
        log = LogControl(self.redis, self.settings.log_level, self.settings.log_settings_refresh_s)
        self.tasks.spawn(log.run(), "log settings")
        self.stall.start()
        self.tasks.spawn(self.trimmer.run(self.settings.trim_interval_s, self.should_exit), "trim")
        self.tasks.spawn(self.cancels.run(self.should_exit), "cancel notices")
        self.tasks.spawn(self.bls.run(self.should_exit), "replies to model calls")
        handler_metrics = HandlerMetricsPublisher(
            self.redis, self.worker_id, self.settings.handler_metrics_interval_s, self._backends
        )
        self.tasks.spawn(handler_metrics.run(self.should_exit), "handler metrics")
        idle = IdleTrim(self.settings.trim_memory_idle_s, self._last_batch_s)
        self.tasks.spawn(idle.run(self.should_exit), "memory trim")
        if self.settings.pool == "gpu":
            sampler = GpuSampler(self.redis, self.settings.gpu_metrics_interval_s)
            self.tasks.spawn(sampler.run(self.should_exit), "gpu metrics")
        if self.control:
            self.tasks.spawn(self.follower.run(self.should_exit), "follow desired state")
            self.tasks.spawn(self._retire(), "retire lanes")
        await self.should_exit.wait()
        await self._drain()

    def _backends(self) -> list[ModelBackend]:
        return [runner.backend for run in self.runs.values() for runner in run.lane.runners]

    def _last_batch_s(self) -> float:
        return max((run.lane.last_batch_s for run in self.runs.values()), default=0.0)

    async def _drain(self) -> None:
        """Stop intake, then finish what was taken, within the grace period."""
        runs = list(self.runs.values())
        read_timeout_s = self.settings.block_ms / 1000 + 1
        await asyncio.gather(*(run.stop_reading(read_timeout_s) for run in runs))
        await asyncio.gather(*(run.drain(self.shutdown_grace_s) for run in runs))

    async def shutdown(self) -> None:
        for run in self.runs.values():
            await run.close(self.settings.shutdown_grace_s)
        await self.bls.close()
        await self.tasks.cancel_all(self.settings.shutdown_grace_s)
        self.stall.stop()
        await self.heartbeat.stop()
        await self.link.close()
        await self.cancels.close()
        await self.redis.aclose()


def _give_memory_back() -> None:
    """Collect what an unloaded lane held (startup's frozen objects too), then trim."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    trim = malloc_trim()
    if trim is not None:
        trim()
