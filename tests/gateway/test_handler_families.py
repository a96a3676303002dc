"""The metrics port serves what TorchServe handlers recorded, under the handlers' names.

Two workers' hashes of the same series: counters add up across them, a gauge shows the
newest value, invalid names are made valid, Weir's and Triton's namespaces stay Weir's, and a
counter keeps its own name on its TYPE line.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from prometheus_client import CollectorRegistry

from gateway.exporter import MeshCollector
from gateway.metrics_server import exposition
from weir import names
from weir.handler_metrics import COUNTER, GAUGE, HandlerSample, encode
from weir.redis_server import RedisServer

LABELS = (("ModelName", "m"), ("Level", "Model"), ("Hostname", "h"))


@pytest.fixture
def workers(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client; the hashes of the two workers below are deleted after the test."""
    client = redis.Redis.from_url(redis_server.url)
    keys = [names.handler_metrics(f"cpu-{uuid.uuid4().hex}") for _ in range(2)]
    first = [
        HandlerSample("Rows", COUNTER, "count", LABELS, 2.0, 100.0),
        HandlerSample("PredictionTime", GAUGE, "ms", LABELS, 4.5, 100.0),
        HandlerSample("weir_inference_count", COUNTER, "count", LABELS, 1.0, 100.0),
        HandlerSample("Queue depth", GAUGE, "", (("Model-Name", "m"),), 3.0, 100.0),
    ]
    second = [
        HandlerSample("Rows", COUNTER, "count", LABELS, 5.0, 90.0),
        HandlerSample("PredictionTime", GAUGE, "ms", LABELS, 9.0, 101.0),
    ]
    for key, samples in zip(keys, (first, second), strict=True):
        client.hset(key, mapping=encode(samples))  # type: ignore[arg-type]
    yield client
    client.delete(*keys)
    client.close()


def scrape(url: str) -> str:
    registry = CollectorRegistry()
    registry.register(MeshCollector(url, [], follow=False))
    return exposition(registry).decode()


@pytest.mark.usefixtures("workers")
def test_handler_series_are_merged_across_workers_and_named_as_torchserve_names_them(
    redis_server: RedisServer,
) -> None:
    lines = scrape(redis_server.url).splitlines()
    labels = 'Hostname="h",Level="Model",ModelName="m"'  # the text format sorts them
    assert f"Rows{{{labels}}} 7.0" in lines
    assert "# TYPE Rows counter" in lines  # its own name, no _total, as TorchServe's
    assert f"PredictionTime{{{labels}}} 9.0" in lines  # the newest of the two
    assert "# TYPE PredictionTime gauge" in lines
    assert 'Queue_depth{Model_Name="m"} 3.0' in lines
    assert not [line for line in lines if line.startswith("weir_inference_count{")]
