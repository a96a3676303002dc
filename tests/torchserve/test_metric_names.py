"""TorchServe's metric names, derived when scraped from Weir's own families.

The same numbers come from a one-process gateway's plain counts and from prometheus-client's
metric objects (which a multi-process gateway writes); the exposition keeps TorchServe's
names exactly, ``_total`` or not; the host gauges read ``/proc`` and the root file system;
the GPU gauges come from the gpu-pool workers' samples in Redis.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from gateway.exporter import MeshCollector
from gateway.metrics import RequestMetrics
from gateway.metrics_server import exposition as rendered
from gateway.torchserve.host_metrics import HostSampler
from gateway.torchserve.metrics import LATENCY, QUEUE_LATENCY, REQUESTS, TorchServeNames
from tests.gateway.test_gpu_metrics import UUID_A, UUID_B, sample
from tests.gateway.test_request_metrics import replies
from weir import names
from weir.redis_server import RedisServer
from weir.stats import QUEUE, REQUEST, Phase
from weir.wire import InferReply
from workers.gpu_metrics import publish

HOST = "serving-host-7"
TS_VERSIONS = {("a", "1"): "1.0", ("a", "2"): "2.0"}  # model b is not the store's


def ts_version(model: str, version: str) -> str:
    return TS_VERSIONS.get((model, version), version)


def exposition(inner: CollectorRegistry, host: HostSampler | None = None) -> str:
    outer = CollectorRegistry(auto_describe=False)
    outer.register(TorchServeNames(inner, ts_version, HOST, host))
    return rendered(outer).decode()  # as the metrics port renders it


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? (\S+)$")


def parsed(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample line, by its name as written and its labels."""
    found = {}
    for line in text.splitlines():
        matched = SAMPLE.match(line)
        if matched is None:
            continue
        name, labels, value = matched.groups()
        pairs = re.findall(r'([A-Za-z_]+)="([^"]*)"', labels or "")
        found[name, tuple(sorted(pairs))] = float(value)
    return found


def ts_labels(model: str, version: str) -> tuple[tuple[str, str], ...]:
    return (("hostname", HOST), ("model_name", model), ("model_version", version))


def span_us(reply: InferReply, phase: Phase) -> float | None:
    if phase.start in reply.ts and phase.end in reply.ts:
        return max((reply.ts[phase.end] - reply.ts[phase.start]) / 1000, 0.0)
    return None


@pytest.mark.parametrize("collected", [True, False], ids=["one-process", "prometheus-objects"])
def test_ts_series_sum_weirs_own(collected: bool) -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, collected, count_responses=True)
    answered = replies(5, 300)
    requests: dict[tuple[str, str], float] = defaultdict(float)
    latency: dict[tuple[str, str], float] = defaultdict(float)
    queued: dict[tuple[str, str], float] = defaultdict(float)
    for model, version, reply in answered:
        metrics.answered(model, version, reply)
        requests[model, version] += 1
        latency[model, version] += span_us(reply, REQUEST) or 0.0
        queued[model, version] += span_us(reply, QUEUE) or 0.0
    for reason in ("invalid", "rejected", "invalid"):
        metrics.failed("b", "1", reason)
        requests["b", "1"] += 1
    for status in (200, 200, 201, 404, 400, 503, 500, 302, 101):
        metrics.responded(status)
    metrics.flush()  # a process of a multi-process gateway hands its counts on

    found = parsed(exposition(registry))

    for (model, version), count in requests.items():
        labels = ts_labels(model, ts_version(model, version))
        assert found[REQUESTS, labels] == count
        assert found[LATENCY, labels] == pytest.approx(latency[model, version])
        assert found[QUEUE_LATENCY, labels] == pytest.approx(queued[model, version])
    assert {labels for name, labels in found if name == REQUESTS} == {
        ts_labels("a", "1.0"),
        ts_labels("a", "2.0"),
        ts_labels("b", "1"),
    }
    host = (("Hostname", HOST), ("Level", "Host"))
    # As TorchServe counts: 2xx, 4xx, and everything else as 5XX.
    assert found["Requests2XX", host] == 3
    assert found["Requests4XX", host] == 2
    assert found["Requests5XX", host] == 4
    # Weir's own families are served beside them, unchanged.
    assert found["weir_http_responses_total", (("status_class", "4xx"),)] == 2
    success = [v for (n, _), v in found.items() if n == "weir_inference_request_success_total"]
    assert sum(success) == 300


def test_the_exposition_keeps_torchserves_names_and_types() -> None:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, count_responses=True)
    for model, version, reply in replies(2, 10):
        metrics.answered(model, version, reply)
    text = exposition(registry)
    for name in (REQUESTS, LATENCY, QUEUE_LATENCY, "Requests2XX", "Requests5XX"):
        assert f"# TYPE {name} counter" in text
    for name in ("CPUUtilization", "MemoryUsed", "DiskAvailable", "GPUUtilization"):
        assert f"# TYPE {name} gauge" in text
    assert f"{LATENCY}_total" not in text
    assert "_total_total" not in text
    types = {family.name: family.type for family in text_string_to_metric_families(text)}
    for name in (REQUESTS.removesuffix("_total"), LATENCY, QUEUE_LATENCY, "Requests4XX"):
        assert types[name] == "counter"  # a parser reads them as counters
    assert 'Requests2XX{Hostname="serving-host-7",Level="Host"} 0.0' in text


def test_without_counted_responses_there_is_no_weir_responses_family() -> None:
    registry = CollectorRegistry()
    RequestMetrics(registry)
    assert "weir_http_responses" not in generate_latest(registry).decode()


def write_proc(proc: Path, user: int, idle: int, total_kb: int, available_kb: int) -> None:
    proc.mkdir(exist_ok=True)
    (proc / "stat").write_text(
        f"cpu  {user} 0 {user} {idle} 0 0 0 0 0 0\ncpu0 {user} 0 {user} {idle} 0 0 0 0 0 0\n"
    )
    (proc / "meminfo").write_text(
        f"MemTotal:       {total_kb} kB\nMemFree:        1024 kB\n"
        f"MemAvailable:   {available_kb} kB\nBuffers:        0 kB\n"
    )


HOST_GAUGES = ("CPUUtilization", "Memory", "Disk")


def gauges(text: str) -> dict[str, float]:
    """The host gauges' values, by name."""
    return {
        name: value for (name, _), value in parsed(text).items() if name.startswith(HOST_GAUGES)
    }


def test_host_gauges_read_proc_and_the_root_file_system(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write_proc(proc, user=300, idle=400, total_kb=8 * 1024 * 1024, available_kb=6 * 1024 * 1024)
    sampler = HostSampler(proc, str(tmp_path))

    first = gauges(exposition(CollectorRegistry(), sampler))
    assert first["CPUUtilization"] == 60.0  # since boot: 600 busy of 1000
    assert first["MemoryUsed"] == 2048.0
    assert first["MemoryAvailable"] == 6144.0
    assert first["MemoryUtilization"] == 25.0
    disk = shutil.disk_usage(tmp_path)
    assert first["DiskAvailable"] == pytest.approx(disk.free / 2**30, abs=0.5)
    assert first["DiskUsage"] == pytest.approx(disk.used / 2**30, abs=0.5)
    assert 0 <= first["DiskUtilization"] <= 100

    write_proc(proc, user=350, idle=700, total_kb=8 * 1024 * 1024, available_kb=2 * 1024 * 1024)
    second = gauges(exposition(CollectorRegistry(), sampler))
    assert second["CPUUtilization"] == 25.0  # since the last scrape: 100 busy of 400
    assert second["MemoryUtilization"] == 75.0


def test_a_host_value_that_cannot_be_read_is_left_out(tmp_path: Path) -> None:
    sampler = HostSampler(tmp_path / "no-proc", str(tmp_path / "no-root"))
    text = exposition(CollectorRegistry(), sampler)
    assert "# TYPE MemoryUsed gauge" in text
    assert gauges(text) == {}


async def test_gpu_gauges_come_from_the_gpu_pools_samples(redis_server: RedisServer) -> None:
    client = Redis.from_url(redis_server.url)
    try:
        await publish(client, [sample(UUID_A, 2**30), sample(UUID_B, 2 * 2**30)], ttl_s=60)
        inner = CollectorRegistry()
        inner.register(MeshCollector(redis_server.url, [], follow=False))
        found = parsed(await asyncio.to_thread(exposition, inner))
    finally:
        await client.delete(names.gpu_stats(UUID_A), names.gpu_stats(UUID_B))
        await client.aclose()

    def gpu(name: str, uuid: str) -> float:
        return found[name, (("DeviceId", uuid), ("Hostname", HOST), ("Level", "Host"))]

    assert gpu("GPUUtilization", UUID_A) == pytest.approx(42.0)
    assert gpu("GPUMemoryUsed", UUID_A) == 1024.0
    assert gpu("GPUMemoryUsed", UUID_B) == 2048.0
    assert gpu("GPUMemoryUtilization", UUID_B) == pytest.approx(2 * 2**30 / 85_899_345_920 * 100)
