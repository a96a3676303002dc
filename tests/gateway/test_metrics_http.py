"""The metrics endpoint exports Triton-named request, queue, compute and batch metrics."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chaos.helpers import Topology, private_repository, tiny_body
from tests.conftest import Mesh, http_ready, wait_until
from weir.redis_server import RedisServer, free_port

LABELS = {"model": "tiny_mlp", "version": "1"}


def samples(metrics_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(metrics_url, timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return found.get((name, tuple(sorted({**LABELS, **labels}.items()))), 0.0)


def test_metrics_count_requests_phases_and_batches(mesh: Mesh) -> None:
    import numpy as np

    before = samples(mesh.metrics_url)
    for _ in range(3):
        body = tiny_body(np.ones(64, dtype=np.float32))
        assert httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body).status_code == 200
    bad = {"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [1, 64], "data": [0] * 64}]}
    assert httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=bad).status_code == 400
    after = samples(mesh.metrics_url)

    def grew(name: str, by: float, **labels: str) -> bool:
        return value(after, name, **labels) - value(before, name, **labels) == by

    assert grew("weir_inference_request_success_total", 3)
    assert grew("weir_inference_request_failure_total", 1, reason="INVALID")
    for phase in ("queue", "compute_input", "compute_infer", "compute_output", "request"):
        assert grew(f"weir_inference_{phase}_duration_us_count", 3), phase
    assert grew("weir_inference_count_total", 3)
    assert value(after, "weir_inference_exec_count_total") >= 1
    # One observation per executed batch, summing to the inferences run.
    executions = value(after, "weir_inference_exec_count_total")
    assert value(after, "weir_inference_batch_size_count") == executions
    assert value(after, "weir_inference_batch_size_sum") == value(
        after, "weir_inference_count_total"
    )
    assert ("weir_inference_pending_request_count", tuple(sorted(LABELS.items()))) in after


def test_name_filters_keep_only_the_series_named(mesh: Mesh) -> None:
    import numpy as np

    body = tiny_body(np.ones(64, dtype=np.float32))
    assert httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body).status_code == 200
    wanted = {
        "weir_inference_request_success_total",  # the gateway's own, kept as plain numbers
        "weir_inference_pending_request_count",  # the mesh's, read from Redis when scraped
        "weir_inference_queue_duration_us_sum",
    }
    query = "&".join(f"name[]={name}" for name in sorted(wanted))
    found = samples(f"{mesh.metrics_url}?{query}")
    assert {name for name, _ in found} == wanted
    assert value(found, "weir_inference_request_success_total") >= 1
    assert (
        "weir_inference_request_success_total"
        not in httpx.get(f"{mesh.metrics_url}?name[]=nothing_by_that_name", timeout=10).text
    )


@pytest.mark.timeout(90)
def test_multi_process_gateway_serves_and_aggregates_metrics(
    tmp_path: Path, example_repository: Path
) -> None:
    import numpy as np

    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    port, metrics_port = free_port(), free_port()
    with RedisServer() as server:
        mesh = Topology(server.url, repository, tmp_path)
        try:
            mesh.start("batcher", "batcher")
            mesh.start("worker", "worker")
            gateway = mesh.start(
                "gateway", "gateway", WEIR_GATEWAY_HTTP_PORT=str(port),
                WEIR_GATEWAY_METRICS_PORT=str(metrics_port), WEIR_GATEWAY_PROCESSES="2",
            )  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: http_ready(f"{url}/v2/health/ready"), 60, "the gateway")
            body = tiny_body(np.ones(64, dtype=np.float32))
            for _ in range(20):
                # A new connection each time, so the kernel spreads them over both processes.
                assert httpx.post(f"{url}/v2/models/tiny_mlp/infer", json=body).status_code == 200
            # Each process hands its counts to the shared files every metrics_flush_s.
            found: dict = {}

            def counted() -> bool:
                found.update(samples(f"http://127.0.0.1:{metrics_port}/metrics"))
                return value(found, "weir_inference_request_success_total") >= 20

            wait_until(counted, 10, "both processes' answers in the metrics")
            assert value(found, "weir_inference_request_success_total") == 20
            for phase in ("request", "queue", "compute_infer"):
                name = f"weir_inference_{phase}_duration_us"
                assert value(found, f"{name}_count") == 20, phase
                assert value(found, f"{name}_bucket", le="+Inf") == 20, phase
                assert value(found, f"{name}_sum") > 0, phase
            assert mesh.log("gateway").count("Application startup complete") == 2
            gateway.send_signal(signal.SIGTERM)
            assert gateway.wait(30) == 0
        finally:
            mesh.stop_all()
