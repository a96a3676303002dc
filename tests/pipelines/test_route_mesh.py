"""Pipelines run through the mesh: fan-out, a fan-in join, intermediate tensors, failures.

A small pipeline of python models: X feeds ``double`` and ``square`` in parallel (fan-out),
and ``add`` joins their outputs (fan-in) into S = 2X + X². Every step is a model of its own,
batched by its own batcher and run by the worker pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from tests.conftest import Mesh, private_redis, start_mesh

HANDLER = """
import numpy as np


class Handler:
    def initialize(self, context):
        self.name = context.model_name

    def inference(self, batch):
        {body}
"""
BODIES = {
    "double": 'return {"Y": batch["X"] * 2}',
    "square": 'return {"Y": batch["X"] ** 2}',
    "add": 'if (batch["A"] > 1e5).any():\n            raise ValueError("too large to add")\n'
           '        return {"S": batch["A"] + batch["B"]}',
}  # fmt: skip


def fp32(name: str) -> dict[str, object]:
    return {"name": name, "data_type": "TYPE_FP32", "dims": [4]}


def write_model(root: Path, name: str, inputs: list[str], outputs: list[str]) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(HANDLER.format(body=BODIES[name]))
    config = {
        "name": name, "backend": "python", "max_batch_size": 16,
        "input": [fp32(n) for n in inputs], "output": [fp32(n) for n in outputs],
        "dynamic_batching": {"max_queue_delay_microseconds": 1000},
    }  # fmt: skip
    (root / name / "config.yaml").write_text(yaml.safe_dump(config))


def write_pipeline(root: Path) -> None:
    (root / "combo").mkdir()
    config = {
        "name": "combo", "platform": "ensemble", "max_batch_size": 16,
        "input": [fp32("X")], "output": [fp32("S")],
        "ensemble_scheduling": {"step": [
            {"model_name": "double", "model_version": -1, "input_map": {"X": "X"},
             "output_map": {"Y": "d"}},
            {"model_name": "square", "model_version": -1, "input_map": {"X": "X"},
             "output_map": {"Y": "q"}},
            {"model_name": "add", "model_version": -1, "input_map": {"A": "d", "B": "q"},
             "output_map": {"S": "S"}},
        ]},
    }  # fmt: skip
    (root / "combo" / "config.yaml").write_text(yaml.safe_dump(config))


# On a cluster the three steps' models lie on three different primaries (slots 7395, 15608
# and 1943 of the 0-5460, 5461-10922, 10923-16383 split redis-cli makes), and the route's
# hash on a fourth slot: every hop of the route crosses slots.
@pytest.fixture(scope="module", params=["single", "cluster"])
def pipeline_mesh(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("pipeline-models")
    write_model(root, "double", ["X"], ["Y"])
    write_model(root, "square", ["X"], ["Y"])
    write_model(root, "add", ["A", "B"], ["S"])
    write_pipeline(root)
    with private_redis(request.param) as server:
        if request.param == "cluster":
            primaries = {server.primary_of(f"{{{m}}}").port for m in ("double", "square", "add")}
            assert len(primaries) == 3
        mesh = start_mesh(server.url, root)
        yield mesh
        mesh.stop()


def body(x: np.ndarray, outputs: list[str] | None = None) -> dict[str, object]:
    request: dict[str, object] = {
        "inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}]
    }
    if outputs:
        request["outputs"] = [{"name": name} for name in outputs]
    return request


def outputs_of(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {
        o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
        for o in response.json()["outputs"]
    }


def test_parallel_steps_join_into_the_pipeline_output(pipeline_mesh: Mesh) -> None:
    rows = np.random.default_rng(0).standard_normal((12, 4)).astype(np.float32)

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=pipeline_mesh.url, timeout=60) as client:
            singles = [client.post("/v2/models/combo/infer", json=body(rows[i : i + 1]))
                       for i in range(8)]  # fmt: skip
            return await asyncio.gather(
                *singles, client.post("/v2/models/combo/infer", json=body(rows[8:]))
            )

    responses = asyncio.run(send())
    got = np.concatenate([outputs_of(r)["S"] for r in responses])
    np.testing.assert_allclose(got, 2 * rows + rows**2, rtol=1e-6)
    assert all([o["name"] for o in r.json()["outputs"]] == ["S"] for r in responses)


def test_ready_reports_the_pipeline_when_every_step_is_served(pipeline_mesh: Mesh) -> None:
    assert httpx.get(f"{pipeline_mesh.url}/v2/models/combo/ready").status_code == 200


def test_intermediate_tensors_are_returned_only_when_asked(pipeline_mesh: Mesh) -> None:
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    only_d = outputs_of(httpx.post(f"{pipeline_mesh.url}/v2/models/combo/infer",
                                   json=body(x, ["d"])))  # fmt: skip
    assert list(only_d) == ["d"]
    np.testing.assert_array_equal(only_d["d"], 2 * x)
    both = outputs_of(httpx.post(f"{pipeline_mesh.url}/v2/models/combo/infer",
                                 json=body(x, ["S", "q"])))  # fmt: skip
    np.testing.assert_array_equal(both["S"], 2 * x + x**2)
    np.testing.assert_array_equal(both["q"], x**2)
    unknown = httpx.post(f"{pipeline_mesh.url}/v2/models/combo/infer", json=body(x, ["nope"]))
    assert unknown.status_code == 400
    assert "nope" in unknown.json()["error"]


def test_a_failing_step_answers_once_naming_step_model_and_version(pipeline_mesh: Mesh) -> None:
    x = np.full((1, 4), 1e6, dtype=np.float32)
    response = httpx.post(f"{pipeline_mesh.url}/v2/models/combo/infer", json=body(x), timeout=60)
    assert response.status_code == 500
    message = response.json()["error"]
    assert "pipeline 'combo'" in message
    assert "model 'add' version 1" in message
    assert "too large to add" in message
    ok = httpx.post(
        f"{pipeline_mesh.url}/v2/models/combo/infer", json=body(np.ones((1, 4), np.float32))
    )
    assert ok.status_code == 200


def test_each_step_records_its_queue_and_compute_time(pipeline_mesh: Mesh) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    assert httpx.post(f"{pipeline_mesh.url}/v2/models/combo/infer", json=body(x)).status_code == 200
    for step_model in ("double", "square", "add"):
        response = httpx.get(f"{pipeline_mesh.url}/v2/models/{step_model}/stats")
        (stats,) = response.json()["model_stats"]
        inference = stats["inference_stats"]
        assert inference["success"]["count"] >= 1, step_model
        for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
            assert inference[phase]["count"] == inference["success"]["count"], (step_model, phase)
            assert inference[phase]["ns"] > 0, (step_model, phase)
