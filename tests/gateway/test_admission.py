"""Queue policy and priorities through a real mesh: max_queue_size, priority, timeouts.

The mesh runs on its own redis-server and a temporary repository: ``wide_mlp`` with
``default_queue_policy: {max_queue_size: 4}`` and two priority levels, and ``tiny_deadline``
(a copy of ``tiny_mlp``) whose ``default_timeout_microseconds`` is 1 µs.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import yaml

from tests.conftest import Mesh, private_mesh, wait_until
from weir import names
from weir.redis_io.connection import connect_sync

MAX_QUEUE_SIZE = 4
BURST = 48
WIDE = "wide_mlp"
DEADLINE_MODEL = "tiny_deadline"


def rewrite_config(model_dir: Path, **changes: Any) -> None:
    path = model_dir / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config.update(changes)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def build_repository(build_models: ModuleType, root: Path) -> Path:
    repository = root / "models"
    build_models.build_model(repository, WIDE)
    rewrite_config(
        repository / WIDE,
        dynamic_batching={
            "max_queue_delay_microseconds": 2000,
            "priority_levels": 2,
            "default_priority_level": 2,
            "default_queue_policy": {"max_queue_size": MAX_QUEUE_SIZE},
        },
    )
    scratch = root / "scratch"
    build_models.build_model(scratch, "tiny_mlp")
    shutil.copytree(scratch / "tiny_mlp", repository / DEADLINE_MODEL)
    rewrite_config(
        repository / DEADLINE_MODEL,
        name=DEADLINE_MODEL,
        dynamic_batching={
            "max_queue_delay_microseconds": 2000,
            "default_queue_policy": {"default_timeout_microseconds": 1},
        },
    )
    return repository


@pytest.fixture(scope="module", params=["single", "cluster"])
def admission_mesh(
    build_models: ModuleType,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Mesh]:
    repository = build_repository(build_models, tmp_path_factory.mktemp("admission"))
    env = {"WEIR_WORKER_TORCH_THREADS": "1"}
    with private_mesh(repository, env, request.param) as running:
        yield running


def infer_body(batch: np.ndarray, **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(batch.shape),
                "data": batch.tolist(),
            }
        ]
    }
    if parameters:
        body["parameters"] = parameters
    return body


def wide_input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 1024), dtype=np.float32)


def post(mesh: Mesh, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{mesh.url}/v2/models/{model}/infer", json=body, timeout=30)


def output_of(response: httpx.Response) -> np.ndarray:
    (output,) = response.json()["outputs"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def queued(mesh: Mesh, model: str) -> int:
    with connect_sync(mesh.redis_url) as client:
        return int(client.get(names.queued_counter(model, "1")) or 0)


async def send_burst(mesh: Mesh, inputs: list[np.ndarray]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(inputs))
    async with httpx.AsyncClient(base_url=mesh.url, timeout=30, limits=limits) as client:
        return await asyncio.gather(
            *(client.post(f"/v2/models/{WIDE}/infer", json=infer_body(x)) for x in inputs)
        )


def test_a_full_queue_refuses_with_503_and_retry_after(
    admission_mesh: Mesh, build_models: ModuleType
) -> None:
    inputs = [wide_input(seed) for seed in range(BURST)]
    responses = asyncio.run(send_burst(admission_mesh, inputs))

    with torch.inference_mode():
        expected = build_models.reference_module(WIDE)(torch.from_numpy(np.concatenate(inputs)))
    statuses = [r.status_code for r in responses]
    for response, want in zip(responses, expected.numpy(), strict=True):
        assert response.status_code in (200, 503), response.text
        if response.status_code == 200:
            np.testing.assert_allclose(output_of(response), want[None], atol=1e-4)
            continue
        body = response.json()
        assert set(body) == {"error"}
        assert body["error"].endswith(f"exceeds maximum queue size {MAX_QUEUE_SIZE}")
        assert f"'{WIDE}'" in body["error"]
        assert response.headers["retry-after"].isdigit()
    assert statuses.count(503) >= 1, statuses
    assert statuses.count(200) >= 1, statuses

    # Every admitted request was answered: the queue counter is back to empty, room again.
    wait_until(lambda: queued(admission_mesh, WIDE) == 0, 10, "the wide_mlp queue to empty")
    x = wide_input(1000)
    response = post(admission_mesh, WIDE, infer_body(x))
    assert response.status_code == 200, response.text
    with torch.inference_mode():
        want = build_models.reference_module(WIDE)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(output_of(response), want, atol=1e-4)


@pytest.mark.parametrize("priority", [1, 2])
def test_priorities_within_priority_levels_are_served(
    admission_mesh: Mesh, build_models: ModuleType, priority: int
) -> None:
    x = wide_input(priority)
    response = post(admission_mesh, WIDE, infer_body(x, priority=priority))

    assert response.status_code == 200, response.text
    with torch.inference_mode():
        want = build_models.reference_module(WIDE)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(output_of(response), want, atol=1e-4)


def test_priority_above_priority_levels_is_a_400_naming_priority_levels(
    admission_mesh: Mesh,
) -> None:
    response = post(admission_mesh, WIDE, infer_body(wide_input(0), priority=3))

    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"}
    assert "priority_levels" in response.json()["error"]


@pytest.mark.parametrize("priority", [-1, "x", 1.5, True])
def test_priority_that_is_not_a_non_negative_integer_is_a_400(
    admission_mesh: Mesh, priority: object
) -> None:
    response = post(admission_mesh, WIDE, infer_body(wide_input(0), priority=priority))

    assert response.status_code == 400, response.text
    assert "priority" in response.json()["error"]


@pytest.mark.parametrize("timeout", ["abc", -5, 2.5, True])
def test_timeout_parameter_that_is_not_a_whole_number_of_microseconds_is_a_400(
    admission_mesh: Mesh, timeout: object
) -> None:
    response = post(admission_mesh, WIDE, infer_body(wide_input(0), timeout=timeout))

    assert response.status_code == 400, response.text
    assert "timeout" in response.json()["error"]


def failures(mesh: Mesh, model: str) -> int:
    stats = httpx.get(f"{mesh.url}/v2/models/{model}/stats").json()["model_stats"][0]
    return int(stats["inference_stats"]["fail"]["count"])


def test_default_timeout_microseconds_answers_504_in_tritons_words(admission_mesh: Mesh) -> None:
    x = np.ones((1, 64), dtype=np.float32)
    failed_before = failures(admission_mesh, DEADLINE_MODEL)
    response = post(admission_mesh, DEADLINE_MODEL, infer_body(x))

    assert response.status_code == 504, response.text
    assert set(response.json()) == {"error"}
    # Expired in a queue (Triton's exact text) or in the gateway's wait (naming the model).
    assert response.json()["error"].startswith("Request timeout expired")
    # The request that timed out was still taken out of the queue by the mesh.
    wait_until(
        lambda: queued(admission_mesh, DEADLINE_MODEL) == 0, 10, "the expired request to leave"
    )
    # ...and counted as a failure in the model's statistics, as Triton counts it.
    wait_until(
        lambda: failures(admission_mesh, DEADLINE_MODEL) == failed_before + 1,
        10,
        "the expired request to count as a failure",
    )


def test_a_queue_counter_below_zero_refuses_nothing(admission_mesh: Mesh) -> None:
    # Replies to requests queued before a Redis restart can take the counter below zero.
    client = connect_sync(admission_mesh.redis_url)
    key = names.queued_counter(WIDE, "1")
    wait_until(lambda: queued(admission_mesh, WIDE) == 0, 10, "the wide_mlp queue to empty")
    client.set(key, -3)
    try:
        response = post(admission_mesh, WIDE, infer_body(wide_input(7)))
        assert response.status_code == 200, response.text
    finally:
        client.set(key, 0)
