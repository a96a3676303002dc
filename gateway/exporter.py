"""The metrics endpoint (port 8002): the gateways' request metrics plus the mesh's own.

Request metrics live in each gateway process (aggregated over processes through
prometheus-client's multiprocess directory when there are several). What the workers record
per batch, and the queued-request counters, live in Redis and are read at scrape time: the
execution and inference counts, the batch-size histogram and the pending-request gauge. The
gpu-pool workers' NVML samples become Triton's ``nv_gpu_*`` and ``nv_energy_consumption``
series, one per GPU (``gpu_uuid``), while their hashes live; what TorchServe handlers record,
series of their own names (:mod:`gateway.handler_families`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.handler_families import handler_families
from gateway.metrics_server import ScrapeLimits, serve_metrics
from weir import names
from weir.config import Backend
from weir.control.desired import DesiredState
from weir.redis_io.connection import connect_sync
from weir.redis_io.hashes import hashes_matching
from weir.repository import ModelEntry
from weir.stats import Field, batch_sizes

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# Triton's GPU gauges: (name, help, the field of names.gpu_stats that holds the value).
GPU_GAUGES = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", names.GPU_UTILIZATION),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", names.GPU_MEMORY_TOTAL_BYTES),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", names.GPU_MEMORY_USED_BYTES),
    ("nv_gpu_power_usage", "GPU power usage in watts", names.GPU_POWER_USAGE_W),
    ("nv_gpu_power_limit", "GPU power management limit in watts", names.GPU_POWER_LIMIT_W),
)
ENERGY = "nv_energy_consumption"


class MeshCollector(Collector):
    """Reads the workers' per-batch counters and the queue counters from Redis."""

    def __init__(self, redis_url: str, repository: Iterable[ModelEntry], follow: bool) -> None:
        self.redis = connect_sync(redis_url, socket_timeout=2.0)
        self.repository = repository
        self.follow = follow  # a model control mode: the lanes are the desired state's

    @property
    def lanes(self) -> list[tuple[str, str]]:
        if not self.follow:
            return [
                (e.name, v) for e in self.repository if not e.config.is_ensemble for v in e.versions
            ]
        raw = self.redis.get(names.desired_state())
        state = DesiredState.decode(raw) if isinstance(raw, bytes) else DesiredState()
        return [
            (m.name, v)
            for m in state.models.values()
            if m.config.get("backend") != Backend.ENSEMBLE.value
            for v in m.versions
        ]

    def collect(self) -> Iterator[Metric]:
        try:
            lanes, stats, queued = self._read()
        except redis.RedisError as exc:
            logger.warning("metrics: Redis unreachable: %s", exc)
            return
        labels = ["model", "version"]
        executions = CounterMetricFamily(
            "weir_inference_exec_count", "Batches executed", labels=labels
        )
        inferences = CounterMetricFamily("weir_inference_count", "Inferences run", labels=labels)
        pending = GaugeMetricFamily(
            "weir_inference_pending_request_count", "Requests queued or running", labels=labels
        )
        batch = HistogramMetricFamily(
            "weir_inference_batch_size", "Batch sizes executed by the workers", labels=labels
        )
        cache = _cache_families()
        for (model, version), recorded, waiting in zip(lanes, stats, queued, strict=True):
            counts = {k.decode(): int(v) for k, v in recorded.items()}
            executions.add_metric([model, version], counts.get(Field.EXECUTION_COUNT, 0))
            inferences.add_metric([model, version], counts.get(Field.INFERENCE_COUNT, 0))
            pending.add_metric([model, version], max(int(waiting or 0), 0))
            inferred = counts.get(Field.INFERENCE_COUNT, 0)
            batch.add_metric([model, version], _buckets(counts), inferred)
            cached = Field.CACHE_HIT_COUNT in counts or Field.CACHE_MISS_COUNT in counts
            for family, field, scale in cache if cached else ():
                value = counts.get(field, 0) / scale
                family.add_sample(family.name, {"model": model, "version": version}, value)
        yield from (executions, inferences, pending, batch)
        yield from (family for family, _, _ in cache if family.samples)  # a model's cache
        yield from self._gpus()
        yield from self._handlers()

    def _gpus(self) -> list[Metric]:
        try:
            return gpu_families(self.redis)
        except redis.RedisError as exc:
            logger.warning("metrics: GPU samples unreadable: %s", exc)
            return []

    def _handlers(self) -> list[Metric]:
        try:
            return handler_families(self.redis)
        except redis.RedisError as exc:
            logger.warning("metrics: the handlers' metrics are unreadable: %s", exc)
            return []

    def _read(
        self,
    ) -> tuple[list[tuple[str, str]], list[dict[bytes, bytes]], list[bytes | None]]:
        lanes = self.lanes
        pipe = self.redis.pipeline(transaction=False)
        for model, version in lanes:
            pipe.hgetall(names.model_stats(model, version))
        for model, version in lanes:
            pipe.get(names.queued_counter(model, version))
        replies = pipe.execute()
        return lanes, replies[: len(lanes)], replies[len(lanes) :]


def _buckets(counts: dict[str, int]) -> list[tuple[str, float]]:
    sizes = batch_sizes(counts)
    cumulative = [
        (str(bound), float(sum(c for s, c in sizes.items() if s <= bound)))
        for bound in BATCH_BUCKETS
    ]
    return [*cumulative, ("+Inf", float(sum(sizes.values())))]


def gpu_families(client: redis.Redis) -> list[Metric]:
    """Triton's GPU series from the GPU hashes that exist now; none when there are none."""
    found = hashes_matching(client, names.gpu_stats_pattern())
    if not found:
        return []
    samples = [{k.decode(): v.decode() for k, v in raw.items()} for raw in found]
    gauges = [GaugeMetricFamily(n, doc, labels=[names.GPU_UUID]) for n, doc, _ in GPU_GAUGES]
    # Triton's counter has no _total suffix; its samples keep Triton's name exactly.
    energy = Metric(ENERGY, "GPU energy consumption in joules since the driver loaded", "counter")
    for sample in sorted(samples, key=lambda s: s.get(names.GPU_UUID, "")):
        uuid = sample.get(names.GPU_UUID)
        for gauge, (_, _, field) in zip(gauges, GPU_GAUGES, strict=True):
            if uuid and field in sample:
                gauge.add_metric([uuid], float(sample[field]))
        if uuid and names.GPU_ENERGY_J in sample:
            energy.add_sample(ENERGY, {names.GPU_UUID: uuid}, float(sample[names.GPU_ENERGY_J]))
    return [*gauges, energy]


class MetricsServer:
    """Serves a registry on the metrics port from a background thread (bounded, cached)."""

    def __init__(
        self, registry: CollectorRegistry, host: str, port: int, limits: ScrapeLimits
    ) -> None:
        self.server: WSGIServer | None = None
        self.thread: threading.Thread | None = None
        if port:
            self.server, self.thread = serve_metrics(registry, host, port, limits)
            logger.info("metrics on http://%s:%d/metrics", host, port)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.thread is not None:
            self.thread.join(5)


def _cache_families() -> list[tuple[Metric, str, float]]:
    """Triton's response cache counters (its names, no ``_total``), with field and scale."""
    return [
        (Metric(name, text, "counter"), field, scale)
        for name, text, field, scale in (
            ("nv_cache_num_hits_per_model", "Response cache hits", Field.CACHE_HIT_COUNT, 1),
            ("nv_cache_num_misses_per_model", "Response cache misses", Field.CACHE_MISS_COUNT, 1),
            (
                "nv_cache_hit_duration_per_model",
                "Microseconds spent finding answers in the response cache",
                Field.CACHE_HIT_NS,
                1000,
            ),
            (
                "nv_cache_miss_duration_per_model",
                "Microseconds spent looking in the response cache and keeping answers there",
                Field.CACHE_MISS_NS,
                1000,
            ),
        )
    ]
