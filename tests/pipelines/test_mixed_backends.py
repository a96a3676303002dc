"""One pipeline across three backends, each step batched and run by its own model's lanes.

    IN -> offset (python: X + 1) -> a -+-> addsub (ONNX Runtime: a + IN, a - IN) -> s, d
    IN --------------------------------+
    s -> double (torch: 2 * s) -> OUT;  d -> DIFF

The ONNX step's config gives only its name, backend and batching: its tensors are filled
from ``model.onnx``. A real mesh serves it; concurrent requests are batched by every step,
as each step's statistics show.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import Mesh, start_mesh
from tests.pipelines.helpers import tensor, write_model
from tests.weir import onnx_models
from weir.redis_server import RedisServer

REQUESTS = 16
STEPS = ("offset", "addsub", "double")
OFFSET = """
import numpy as np

class Offset:
    def initialize(self, context):
        pass

    def inference(self, batch):
        return {"Y": batch["X"] + np.float32(1)}
"""


class Double(torch.nn.Module):
    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X * 2


def batching(model: dict[str, Any]) -> dict[str, Any]:
    return {
        **model,
        "max_batch_size": 16,
        "dynamic_batching": {"max_queue_delay_microseconds": 20000},
    }


def pipeline() -> dict[str, Any]:
    return {
        "name": "mixed",
        "platform": "ensemble",
        "max_batch_size": 16,
        "input": [tensor("IN", [4])],
        "output": [tensor("OUT", [4]), tensor("DIFF", [4])],
        "ensemble_scheduling": {
            "step": [
                {"model_name": "offset", "input_map": {"X": "IN"}, "output_map": {"Y": "a"}},
                {
                    "model_name": "addsub",
                    "input_map": {"INPUT0": "a", "INPUT1": "IN"},
                    "output_map": {"OUTPUT0": "s", "OUTPUT1": "DIFF"},
                },
                {"model_name": "double", "input_map": {"X": "s"}, "output_map": {"Y": "OUT"}},
            ]
        },
    }


def write_repository(root: Path) -> Path:
    offset = batching({"name": "offset", "backend": "python"})
    offset.update(input=[tensor("X", [4])], output=[tensor("Y", [4])])
    model_dir = write_model(root, offset)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(OFFSET))
    write_model(root, batching({"name": "addsub", "backend": "onnxruntime"}))
    onnx_models.save(onnx_models.add_sub(), root / "addsub" / "1" / "model.onnx")
    double = batching({"name": "double", "backend": "pytorch"})
    double.update(input=[tensor("X", [4])], output=[tensor("Y", [4])])
    model_dir = write_model(root, double)
    torch.jit.script(Double()).save(str(model_dir / "1" / "model.pt"))
    write_model(root, pipeline(), versions=())
    return root


@pytest.fixture(scope="module")
def mixed_mesh(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    running = start_mesh(redis_server.url, write_repository(tmp_path_factory.mktemp("mixed")))
    yield running
    running.stop()


def step_batches(mesh: Mesh, model: str) -> dict[int, int]:
    (stats,) = httpx.get(f"{mesh.url}/v2/models/{model}/stats").json()["model_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_each_step_runs_on_its_backend_and_batches_on_its_own(mixed_mesh: Mesh) -> None:
    rows = np.random.default_rng(5).standard_normal((REQUESTS, 4), dtype=np.float32)
    before = {step: step_batches(mixed_mesh, step) for step in STEPS}

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=mixed_mesh.url, timeout=60) as client:
            bodies = [
                {
                    "inputs": [
                        {"name": "IN", "datatype": "FP32", "shape": [1, 4], "data": row.tolist()}
                    ]
                }
                for row in rows
            ]
            return await asyncio.gather(
                *(client.post("/v2/models/mixed/infer", json=b) for b in bodies)
            )

    responses = asyncio.run(send_all())
    for row, response in zip(rows, responses, strict=True):
        assert response.status_code == 200, response.text
        outputs = {o["name"]: np.asarray(o["data"], np.float32) for o in response.json()["outputs"]}
        np.testing.assert_allclose(outputs["OUT"], 2 * ((row + 1) + row), rtol=1e-6)
        np.testing.assert_allclose(outputs["DIFF"], (row + 1) - row, rtol=1e-6)
    for step in STEPS:
        after = step_batches(mixed_mesh, step)
        ran = {size: after.get(size, 0) - before[step].get(size, 0) for size in after}
        assert sum(size * count for size, count in ran.items()) == REQUESTS, (step, ran)
        assert max(size for size, count in ran.items() if count) > 1, (step, ran)


def test_the_onnx_steps_tensors_were_filled_from_its_file(mixed_mesh: Mesh) -> None:
    config = httpx.get(f"{mixed_mesh.url}/v2/models/addsub/config").json()
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["max_batch_size"] == 16
