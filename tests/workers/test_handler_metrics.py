"""What TorchServe handlers record reaches Redis as TorchServe's frontend would keep it.

A counter adds up, a gauge keeps its last value, each call gets TorchServe's default
dimensions (``ModelName`` and ``Level``), and the worker publishes its instances' series,
merged and with ``Hostname``, as one hash that the next publication rewrites.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from weir import names
from weir.handler_metrics import COUNTER, GAUGE, HandlerSample, decode
from weir.redis_server import RedisServer
from workers.backends.base import ModelBackend
from workers.backends.torchserve_metrics import HandlerMetrics
from workers.handler_metrics import HandlerMetricsPublisher


@dataclass
class Dimension:
    """TorchServe's ts.metrics.dimension.Dimension, as handlers build it."""

    name: str
    value: str


def by_series(samples: list[HandlerSample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    return {(s.name, s.labels): (s.kind, s.unit, s.value) for s in samples}


def test_counters_add_up_gauges_keep_the_last_value_and_defaults_are_torchserves() -> None:
    metrics = HandlerMetrics("scorer")
    metrics.add_counter("Loaded", 1)  # outside a batch: TorchServe's Level "Error"
    metrics.set_request_ids({0: "a", 1: "b"})
    metrics.add_counter("Rows", 2)
    metrics.add_counter("Rows", 3)
    metrics.add_time("Work", 12.5)
    metrics.add_time("Work", 7.5)
    metrics.add_metric("Mood", 1, "level", None, [Dimension("Team", "red")], "gauge")
    model = (("ModelName", "scorer"), ("Level", "Model"))
    assert by_series(metrics.samples()) == {
        ("Loaded", (("Level", "Error"),)): (COUNTER, "count", 1),
        ("Rows", model): (COUNTER, "count", 5),
        ("Work", model): (GAUGE, "ms", 7.5),
        ("Mood", (("Team", "red"), *model)): (GAUGE, "level", 1),
    }


class Instance(ModelBackend):
    """An instance whose handler recorded ``metrics``."""

    def __init__(self, metrics: HandlerMetrics) -> None:
        self.metrics = metrics

    def handler_samples(self) -> list[HandlerSample]:
        return self.metrics.samples()

    def infer(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    connection = Redis.from_url(redis_server.url)
    yield connection
    await connection.aclose()


async def test_a_workers_instances_are_published_merged_and_then_rewritten(client: Redis) -> None:
    first, second = HandlerMetrics("m"), HandlerMetrics("m")
    for metrics, rows, took_ms in ((first, 2, 4.0), (second, 3, 9.0)):
        metrics.set_request_ids({0: "r"})
        metrics.add_counter("Rows", rows)
        metrics.add_time("PredictionTime", took_ms)
    instances: list[ModelBackend] = [Instance(first), Instance(second)]
    worker = f"cpu-{uuid.uuid4().hex}"
    publisher = HandlerMetricsPublisher(client, worker, 60.0, lambda: instances, "host-1")
    key = names.handler_metrics(worker)
    try:
        await publisher.publish_once()
        labels = (("ModelName", "m"), ("Level", "Model"), ("Hostname", "host-1"))
        assert by_series(decode(await client.hgetall(key))) == {
            ("Rows", labels): (COUNTER, "count", 5),
            ("PredictionTime", labels): (GAUGE, "ms", 9.0),  # the newer of the two
        }
        assert 0 < await client.pttl(key) <= 180_000  # three intervals

        instances.clear()  # its archives unloaded: the next publication leaves nothing
        await publisher.publish_once()
        assert await client.exists(key) == 0
    finally:
        await client.delete(key)


async def test_a_worker_without_handler_metrics_writes_nothing(client: Redis) -> None:
    worker = f"cpu-{uuid.uuid4().hex}"
    silent = [Instance(HandlerMetrics("m"))]
    publisher = HandlerMetricsPublisher(client, worker, 60.0, lambda: silent)
    await publisher.publish_once()
    assert await client.exists(names.handler_metrics(worker)) == 0
