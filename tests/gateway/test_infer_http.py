"""Inference over real HTTP against the running mesh: answers, binary data, tritonclient."""

from __future__ import annotations

import asyncio
import struct
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import torch

from tests.conftest import Mesh

pytestmark = pytest.mark.cluster_too


def reference(build_models: ModuleType, model: str, batch: np.ndarray) -> np.ndarray:
    module = build_models.reference_module(model)
    with torch.inference_mode():
        return module(torch.from_numpy(batch)).numpy()


def json_body(batch: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(batch.shape),
                "data": batch.tolist(),
            }
        ],
        **extra,
    }


def binary_body(batch: np.ndarray, outputs_binary: bool) -> tuple[bytes, int]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": list(batch.shape),
                    "parameters": {"binary_data_size": batch.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": outputs_binary}}],
        }
    )
    return header + batch.astype("<f4").tobytes(), len(header)


@pytest.mark.parametrize(("model", "width"), [("tiny_mlp", 64), ("wide_mlp", 1024)])
def test_json_inference_matches_torch_reference(
    mesh: Mesh, build_models: ModuleType, model: str, width: int
) -> None:
    batch = np.random.default_rng(0).standard_normal((3, width), dtype=np.float32)
    response = httpx.post(f"{mesh.url}/v2/models/{model}/infer", json=json_body(batch), timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model_name"] == model
    assert body["model_version"] == "1"
    (output,) = body["outputs"]
    assert output["name"] == "OUTPUT0" and output["datatype"] == "FP32"
    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, reference(build_models, model, batch), rtol=1e-4, atol=1e-5)


def test_request_id_is_echoed(mesh: Mesh) -> None:
    batch = np.ones((1, 64), dtype=np.float32)
    response = httpx.post(
        f"{mesh.url}/v2/models/tiny_mlp/versions/1/infer", json=json_body(batch, id="req-42")
    )
    assert response.status_code == 200
    assert response.json()["id"] == "req-42"


@pytest.mark.parametrize("outputs_binary", [True, False])
def test_binary_request_matches_torch_reference(
    mesh: Mesh, build_models: ModuleType, outputs_binary: bool
) -> None:
    batch = np.random.default_rng(1).standard_normal((2, 64), dtype=np.float32)
    content, header_length = binary_body(batch, outputs_binary)
    response = httpx.post(
        f"{mesh.url}/v2/models/tiny_mlp/infer",
        content=content,
        headers={
            "Inference-Header-Content-Length": str(header_length),
            "Content-Type": "application/octet-stream",
        },
    )
    assert response.status_code == 200, response.text
    if outputs_binary:
        json_length = int(response.headers["Inference-Header-Content-Length"])
        header = orjson.loads(response.content[:json_length])
        (output,) = header["outputs"]
        assert output["parameters"]["binary_data_size"] == 2 * 16 * 4
        got = np.frombuffer(response.content[json_length:], dtype="<f4").reshape(output["shape"])
    else:
        assert "Inference-Header-Content-Length" not in response.headers
        (output,) = response.json()["outputs"]
        got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(
        got, reference(build_models, "tiny_mlp", batch), rtol=1e-4, atol=1e-5
    )


def test_tritonclient_http_infers_unmodified(mesh: Mesh, build_models: ModuleType) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("wide_mlp")
        metadata = client.get_model_metadata("wide_mlp")
        assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 1024]}]
        batch = np.random.default_rng(2).standard_normal((4, 1024), dtype=np.float32)
        tensor = triton.InferInput("INPUT0", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        result = client.infer(
            "wide_mlp", [tensor], outputs=[triton.InferRequestedOutput("OUTPUT0")]
        )
        expected = reference(build_models, "wide_mlp", batch)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-4, atol=1e-4)
    finally:
        client.close()


def test_tritonclient_http_sends_and_reads_non_finite_json(
    mesh: Mesh, build_models: ModuleType
) -> None:
    # Triton reads and writes NaN, Infinity and -Infinity in JSON; tritonclient relies on it.
    import tritonclient.http as triton

    client = triton.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        batch = np.zeros((3, 64), dtype=np.float32)
        batch[0, 0], batch[1, 0], batch[2, 0] = np.nan, np.inf, -np.inf
        tensor = triton.InferInput("INPUT0", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch, binary_data=False)
        wanted = triton.InferRequestedOutput("OUTPUT0", binary_data=False)
        result = client.infer("tiny_mlp", [tensor], outputs=[wanted])
        expected = reference(build_models, "tiny_mlp", batch)
        assert not np.isfinite(expected).all()  # the model passes them on
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-4, atol=1e-5)
    finally:
        client.close()


def test_concurrent_requests_are_served_in_batches(mesh: Mesh, build_models: ModuleType) -> None:
    stats_url = f"{mesh.url}/v2/models/wide_mlp/versions/1/stats"

    def recorded() -> dict[int, int]:
        (stats,) = httpx.get(stats_url).json()["model_stats"]
        return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}

    before = recorded()
    rows = np.random.default_rng(3).standard_normal((32, 1024), dtype=np.float32)

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post("/v2/models/wide_mlp/infer", json=json_body(rows[i : i + 1]))
                    for i in range(32)
                )
            )

    responses = asyncio.run(send_all())
    expected = reference(build_models, "wide_mlp", rows)
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        got = np.asarray(output["data"], dtype=np.float32)
        np.testing.assert_allclose(got, expected[i], rtol=1e-4, atol=1e-4)
    after = recorded()
    executed = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert sum(size * count for size, count in executed.items()) == 32
    assert max(size for size, count in executed.items() if count) > 1, executed


def test_bytes_of_a_length_prefixed_tensor_are_counted_exactly(mesh: Mesh) -> None:
    # A binary FP32 tensor one element short must be refused before it is queued.
    batch = np.ones((1, 64), dtype=np.float32)
    content, header_length = binary_body(batch, True)
    content = content[:-4] + struct.pack("<H", 0)
    response = httpx.post(
        f"{mesh.url}/v2/models/tiny_mlp/infer",
        content=content,
        headers={"Inference-Header-Content-Length": str(header_length)},
    )
    assert response.status_code == 400
    assert "INPUT0" in response.json()["error"]


def test_request_timeout_parameter_answers_504(mesh: Mesh) -> None:
    batch = np.ones((1, 1024), dtype=np.float32)
    body = json_body(batch, parameters={"timeout": 1})
    response = httpx.post(f"{mesh.url}/v2/models/wide_mlp/infer", json=body)
    assert response.status_code == 504
    assert "wide_mlp" in response.json()["error"]
