"""A worker pool process: loads the models its pool serves and runs their batches.

A model belongs to the pool its ``instance_group.kind`` names: ``KIND_CPU`` to ``cpu``,
``KIND_GPU`` to ``gpu``; ``KIND_AUTO`` and ``KIND_MODEL`` run in the ``cpu`` pool. Each
instance gets an executor thread. The worker heartbeats with a TTL key listing what it
serves. On SIGTERM it stops reading, finishes and acks the batches it took, and exits.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

from pipelines.graph import load_pipelines
from pipelines.route import Router
from weir import names
from weir.config import InstanceKind, ModelConfig
from weir.connection import connect
from weir.link import Link
from weir.liveness import Heartbeat
from weir.repository import Repository
from weir.service import Service, TaskSet
from weir.settings import WorkerSettings
from weir.streams import StreamGroup
from weir.trim import Trimmer
from weir.workload import encode_served
from workers.backends import load_backend
from workers.execution import BatchRunner
from workers.lane import WorkerLane
from workers.memory import IdleTrim, limit_arenas
from workers.threads import ThreadShare

logger = logging.getLogger(__name__)

POOL_KINDS: dict[str, frozenset[InstanceKind]] = {
    "cpu": frozenset({InstanceKind.CPU, InstanceKind.AUTO, InstanceKind.MODEL}),
    "gpu": frozenset({InstanceKind.GPU}),
}


def instance_count(config: ModelConfig, pool: str) -> int:
    """How many instances of ``config`` this pool runs (0: not this pool's model)."""
    kinds = POOL_KINDS.get(pool, frozenset())
    return sum(group.count for group in config.instance_group if group.kind in kinds)


class Worker(Service):
    """Serves every model of one pool found in the repository."""

    name = "worker"

    def __init__(self, settings: WorkerSettings) -> None:
        super().__init__(settings.shutdown_grace_s)
        self.settings = settings
        self.worker_id = f"{settings.pool}-{settings.name or uuid.uuid4().hex[:12]}"
        self.redis = connect(settings.redis_url, retries=settings.redis_retries)
        self.group = StreamGroup(self.redis, names.WORKER_GROUP, self.worker_id)
        self.link = Link(
            settings.redis_url, settings.redis_timeout_s
        )  # the lanes' transactions (see weir.link)
        self.lanes: list[WorkerLane] = []
        self.tasks = TaskSet()
        self.executor: ThreadPoolExecutor | None = None
        # The worker's threads (every backend's), shared out among the batches computing.
        self.threads = ThreadShare(settings.torch_threads)
        self.heartbeat = Heartbeat(
            self.redis, names.WORKER_GROUP, self.worker_id, settings.heartbeat_ttl_s, self._served
        )

    def _served(self) -> bytes:
        return encode_served([(ln.entry.name, ln.version, len(ln.runners)) for ln in self.lanes])

    async def startup(self) -> None:
        if self.settings.pool not in POOL_KINDS:
            raise ValueError(
                f"unknown pool {self.settings.pool!r}; expected one of {sorted(POOL_KINDS)}"
            )
        limit_arenas()  # before any instance thread allocates
        self._configure_torch()
        repository = Repository.load(self.settings.repository, self.settings.default_max_batch_size)
        router = Router(self.redis, load_pipelines(repository))
        for entry in repository:
            count = instance_count(entry.config, self.settings.pool)
            for version in entry.versions if count else ():
                path = entry.version_path(version)
                first = load_backend(entry.config, path, self.threads, count)
                backends = [first] + [
                    first
                    if first.shareable
                    else load_backend(entry.config, path, self.threads, count)
                    for _ in range(count - 1)
                ]
                runners = [
                    BatchRunner(entry.config, backend, self.settings.isolation_runs)
                    for backend in backends
                ]
                lane = WorkerLane(
                    self.link, self.group, entry, version, runners, self.settings, router
                )
                self.lanes.append(lane)
        await self.group.ensure([lane.stream for lane in self.lanes])
        await self.heartbeat.beat()
        async with self.redis.pipeline(transaction=False) as pipe:
            for lane in self.lanes:
                pipe.execute_command(*lane.credit(len(lane.runners)))
            await pipe.execute()
        instances = sum(len(lane.runners) for lane in self.lanes)
        self.executor = ThreadPoolExecutor(max(instances, 1), thread_name_prefix="instance")
        logger.info(
            "worker %s serving %s with %d instances",
            self.worker_id,
            ", ".join(lane.label for lane in self.lanes) or "nothing",
            instances,
        )

    def _configure_torch(self) -> None:
        if self.settings.torch_threads:
            import torch

            torch.set_num_threads(self.settings.torch_threads)

    async def run(self) -> None:
        if self.executor is None:
            raise RuntimeError("worker.run() before startup()")
        executors = TaskSet()
        for lane in self.lanes:
            for runner in lane.runners:
                executors.spawn(lane.execute(runner, self.executor), f"instance {lane.label}")
        readers = [
            self.tasks.spawn(lane.read(self.should_exit), f"read {lane.label}")
            for lane in self.lanes
        ]
        self.tasks.spawn(self.heartbeat.run(), "heartbeat")
        trimmer = Trimmer(self.redis, names.WORKER_GROUP, [lane.stream for lane in self.lanes])
        self.tasks.spawn(trimmer.run(self.settings.trim_interval_s, self.should_exit), "trim")
        idle = IdleTrim(self.settings.trim_memory_idle_s, self._last_batch_s)
        self.tasks.spawn(idle.run(self.should_exit), "memory trim")
        await self.should_exit.wait()
        await self._drain(readers)
        await executors.cancel_all(self.settings.shutdown_grace_s)

    def _last_batch_s(self) -> float:
        return max((lane.last_batch_s for lane in self.lanes), default=0.0)

    async def _drain(self, readers: list[asyncio.Task[None]]) -> None:
        """Stop intake, then finish what was taken, within the grace period."""
        if readers:
            await asyncio.wait(readers, timeout=self.settings.block_ms / 1000 + 1)
        drains = [asyncio.ensure_future(lane.drain()) for lane in self.lanes]
        if drains:
            await asyncio.wait(drains, timeout=self.shutdown_grace_s)

    async def shutdown(self) -> None:
        await self.tasks.cancel_all(self.settings.shutdown_grace_s)
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        await self.heartbeat.stop()
        for lane in self.lanes:
            await lane.read_link.close()
        await self.link.close()
        await self.redis.aclose()
