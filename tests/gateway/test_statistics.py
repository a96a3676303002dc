"""Triton's statistics extension over real HTTP and gRPC, read with tritonclient unmodified.

The session mesh serves the example repository; the workers record each batch's counters
and the gateway reads them back in Triton's shapes. One more mesh, on its own redis-server
with a management token, shows that the all-model route is guarded as the per-model one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import Mesh, private_mesh

PHASES = ("queue", "compute_input", "compute_infer", "compute_output")
COMPUTE = ("compute_input", "compute_infer", "compute_output")
MANAGEMENT_TOKEN = "stats-admin-secret"


def tiny_input(module: ModuleType, rows: int, seed: int) -> Any:
    x = np.random.default_rng(seed).standard_normal((rows, 64), dtype=np.float32)
    tensor = module.InferInput("INPUT0", [rows, 64], "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def tiny_stats(client: httpclient.InferenceServerClient) -> dict[str, Any]:
    (stats,) = client.get_inference_statistics("tiny_mlp", "1")["model_stats"]
    return dict(stats)


def batches(stats: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(b["batch_size"]): b for b in stats["batch_stats"]}


def test_inferences_add_to_the_counts_and_times_as_triton_defines_them(
    triton_http: httpclient.InferenceServerClient,
) -> None:
    before = tiny_stats(triton_http)
    started_ms = time.time() * 1000
    sizes = [3, 1, 2, 5]
    for seed, rows in enumerate(sizes):
        triton_http.infer("tiny_mlp", [tiny_input(httpclient, rows, seed)])
    finished_ms = time.time() * 1000
    after = tiny_stats(triton_http)

    assert after["inference_count"] - before["inference_count"] == sum(sizes)
    executions = after["execution_count"] - before["execution_count"]
    assert 1 <= executions <= len(sizes)
    assert started_ms <= after["last_inference"] <= finished_ms
    new, old = after["inference_stats"], before["inference_stats"]
    assert new["success"]["count"] - old["success"]["count"] == len(sizes)
    for phase in PHASES:  # one count per request, as Triton counts them
        assert new[phase]["count"] - old[phase]["count"] == len(sizes), phase
        assert new[phase]["ns"] > old[phase]["ns"], phase
    # A request's success time is its whole time in the server: its phases and more.
    spent = {key: new[key]["ns"] - old[key]["ns"] for key in ("success", *PHASES)}
    assert spent["success"] >= sum(spent[phase] for phase in PHASES)
    assert spent["success"] <= len(sizes) * (finished_ms - started_ms) * 1e6


def test_batch_stats_time_each_compute_phase_per_batch_size(
    triton_http: httpclient.InferenceServerClient,
) -> None:
    before = batches(tiny_stats(triton_http))
    triton_http.infer("tiny_mlp", [tiny_input(httpclient, 7, 7)])
    after_stats = tiny_stats(triton_http)
    after = batches(after_stats)

    zero = {phase: {"count": 0, "ns": 0} for phase in COMPUTE}
    ran, had = after[7], before.get(7, zero)
    for phase in COMPUTE:  # the execution of batch size 7 is counted and timed per phase
        assert ran[phase]["count"] == had[phase]["count"] + 1, phase
        assert ran[phase]["ns"] > had[phase]["ns"], phase
    for size, entry in after.items():
        counts = {entry[phase]["count"] for phase in COMPUTE}
        assert len(counts) == 1, (size, entry)
    # Batch statistics cover exactly the model's executions and inferences.
    assert (
        sum(int(e["compute_infer"]["count"]) for e in after.values())
        == (after_stats["execution_count"])
    )
    assert (
        sum(size * int(e["compute_infer"]["count"]) for size, e in after.items())
        == (after_stats["inference_count"])
    )


def test_all_model_stats_list_every_served_version_of_every_model(
    mesh: Mesh,
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
) -> None:
    models = {path.name for path in mesh.repository.iterdir() if path.is_dir()}
    over_http = triton_http.get_inference_statistics()["model_stats"]  # GET /v2/models/stats
    assert {s["name"] for s in over_http} == models
    for stats in over_http:
        served = triton_http.get_model_metadata(stats["name"])["versions"]
        assert stats["version"] in served, stats["name"]
    over_grpc = triton_grpc.get_inference_statistics(as_json=True)["model_stats"]
    assert {(s["name"], s["version"]) for s in over_grpc} == {
        (s["name"], s["version"]) for s in over_http
    }


def test_grpc_statistics_carry_last_inference_and_batch_times(
    triton_grpc: grpcclient.InferenceServerClient,
) -> None:
    started_ms = time.time() * 1000
    triton_grpc.infer("tiny_mlp", [tiny_input(grpcclient, 4, 40)])
    (stats,) = triton_grpc.get_inference_statistics("tiny_mlp").model_stats
    assert started_ms <= stats.last_inference <= time.time() * 1000
    (four,) = [b for b in stats.batch_stats if b.batch_size == 4]
    for phase in COMPUTE:
        assert getattr(four, phase).count >= 1 and getattr(four, phase).ns > 0, phase
    assert stats.inference_stats.success.ns > 0


def test_a_model_never_run_reports_zeros(guarded_mesh: Mesh) -> None:
    # The module's private mesh: no test runs its tiny_mlp (the session mesh's models may
    # have run in any test before this one).
    headers = {"Authorization": f"Bearer {MANAGEMENT_TOKEN}"}
    url = f"{guarded_mesh.url}/v2/models/tiny_mlp/stats"
    (stats,) = httpx.get(url, headers=headers, timeout=10).json()["model_stats"]
    assert stats["execution_count"] == 0 and stats["inference_count"] == 0
    assert stats["last_inference"] == 0 and stats["batch_stats"] == []
    assert stats["inference_stats"]["success"] == {"count": 0, "ns": 0}


@pytest.fixture(scope="module")
def guarded_mesh(
    build_models: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    repository = tmp_path_factory.mktemp("stats") / "models"
    build_models.build_model(repository, "tiny_mlp")
    with private_mesh(repository, {"WEIR_GATEWAY_MANAGEMENT_TOKEN": MANAGEMENT_TOKEN}) as running:
        yield running


def test_all_model_stats_need_the_management_token(guarded_mesh: Mesh) -> None:
    url = f"{guarded_mesh.url}/v2/models/stats"
    refused = httpx.get(url, timeout=10)
    assert refused.status_code == 401 and set(refused.json()) == {"error"}
    client = httpclient.InferenceServerClient(guarded_mesh.url.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException):
            client.get_inference_statistics()
        headers = {"Authorization": f"Bearer {MANAGEMENT_TOKEN}"}
        (stats,) = client.get_inference_statistics(headers=headers)["model_stats"]
    finally:
        client.close()
    assert (stats["name"], stats["version"]) == ("tiny_mlp", "1")
