"""ONNX Runtime and OpenVINO models served by the running mesh, called as Triton's users do.

The example models (tiny_mlp_onnx with its full config.pbtxt, bert_mini_onnx with inputs and
outputs filled from the model, bert_mini_openvino) answer as torch does, over HTTP with
binary and JSON tensors and over gRPC, alone and in batches the batcher forms. A second
mesh serves a repository with no config file at all: identity models of every datatype
ONNX and KServe share, and a model that fails in the runtime on some inputs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import ModuleType

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import Mesh, start_mesh
from tests.weir import onnx_models
from weir.redis_server import RedisServer

TOLERANCE = 1e-5
EXAMPLES = {
    "tiny_mlp_onnx": ("tiny_mlp", "INPUT0", "OUTPUT0"),
    "bert_mini_onnx": ("bert_mini", "input_ids", "logits"),
    "bert_mini_openvino": ("bert_mini", "input_ids", "logits"),
}


def example_batch(model: str, rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if model.startswith("bert_mini"):
        return rng.integers(0, 30522, (rows, 128), dtype=np.int64)
    return rng.standard_normal((rows, 64), dtype=np.float32)


def reference(build_models: ModuleType, model: str, batch: np.ndarray) -> np.ndarray:
    source = EXAMPLES[model][0]
    with torch.inference_mode():
        return build_models.reference_module(source)(torch.from_numpy(batch)).numpy()


def datatype_of(batch: np.ndarray) -> str:
    return "INT64" if batch.dtype == np.int64 else "FP32"


def http_infer(mesh: Mesh, model: str, batch: np.ndarray, binary: bool) -> np.ndarray:
    _, input_name, output_name = EXAMPLES[model]
    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        tensor = httpclient.InferInput(input_name, list(batch.shape), datatype_of(batch))
        tensor.set_data_from_numpy(batch, binary_data=binary)
        wanted = httpclient.InferRequestedOutput(output_name, binary_data=binary)
        return client.infer(model, [tensor], outputs=[wanted]).as_numpy(output_name)
    finally:
        client.close()


def grpc_infer(mesh: Mesh, model: str, batch: np.ndarray) -> np.ndarray:
    _, input_name, output_name = EXAMPLES[model]
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    try:
        tensor = grpcclient.InferInput(input_name, list(batch.shape), datatype_of(batch))
        tensor.set_data_from_numpy(batch)
        return client.infer(model, [tensor]).as_numpy(output_name)
    finally:
        client.close()


@pytest.mark.parametrize("model", sorted(EXAMPLES))
@pytest.mark.parametrize("transport", ["http-binary", "http-json", "grpc"])
@pytest.mark.parametrize("rows", [1, 3])
def test_examples_answer_as_torch_does(
    mesh: Mesh, build_models: ModuleType, model: str, transport: str, rows: int
) -> None:
    batch = example_batch(model, rows, seed=rows)
    if transport == "grpc":
        got = grpc_infer(mesh, model, batch)
    else:
        got = http_infer(mesh, model, batch, binary=transport == "http-binary")
    np.testing.assert_allclose(got, reference(build_models, model, batch), atol=TOLERANCE, rtol=0)


def batch_sizes(mesh: Mesh, model: str) -> dict[int, int]:
    (stats,) = httpx.get(f"{mesh.url}/v2/models/{model}/versions/1/stats").json()["model_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


@pytest.mark.parametrize("model", sorted(EXAMPLES))
def test_concurrent_requests_are_batched_by_the_batcher(
    mesh: Mesh, build_models: ModuleType, model: str
) -> None:
    _, input_name, output_name = EXAMPLES[model]
    rows = example_batch(model, 24, seed=7)
    before = batch_sizes(mesh, model)

    def body(row: np.ndarray) -> dict[str, object]:
        tensor = {"name": input_name, "datatype": datatype_of(rows)}
        return {"inputs": [{**tensor, "shape": [1, *row.shape], "data": row.tolist()}]}

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as client:
            return await asyncio.gather(
                *(client.post(f"/v2/models/{model}/infer", json=body(row)) for row in rows)
            )

    responses = asyncio.run(send_all())
    expected = reference(build_models, model, rows)
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        assert output["name"] == output_name
        np.testing.assert_allclose(output["data"], expected[i], atol=TOLERANCE, rtol=0)
    after = batch_sizes(mesh, model)
    executed = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert sum(size * count for size, count in executed.items()) == len(rows)
    assert max(size for size, count in executed.items() if count) > 1, executed


def test_the_completed_config_is_served_over_http_and_grpc(mesh: Mesh) -> None:
    config = httpx.get(f"{mesh.url}/v2/models/bert_mini_onnx/config").json()
    assert config["backend"] == "onnxruntime"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 64
    assert config["input"] == [
        {
            "name": "input_ids",
            "data_type": "TYPE_INT64",
            "dims": [128],
            "optional": False,
            "allow_ragged_batch": False,
        }
    ]
    assert [(o["name"], o["dims"]) for o in config["output"]] == [("logits", [2])]
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    try:
        over_grpc = client.get_model_config("bert_mini_onnx").config
    finally:
        client.close()
    assert [(t.name, list(t.dims)) for t in over_grpc.input] == [("input_ids", [128])]
    metadata = httpx.get(f"{mesh.url}/v2/models/bert_mini_openvino").json()
    assert metadata["platform"] == "openvino"
    assert metadata["inputs"] == [{"name": "input_ids", "datatype": "INT64", "shape": [-1, 128]}]


# Every datatype an ONNX identity model carries and KServe has (BF16 cannot cross ONNX
# Runtime's Python API as numpy).
DATATYPES = [d for d in onnx_models.ELEMENT_TYPES]


def sample(datatype: str) -> np.ndarray:
    rng = np.random.default_rng(len(datatype))
    if datatype == "BYTES":
        return np.array([["a", "", "ünï"], ["x" * 300, "0", "b c"]], dtype=np.object_)
    if datatype == "BOOL":
        return rng.integers(0, 2, (2, 3)).astype(bool)
    dtype = np.dtype(httpclient.triton_to_np_dtype(datatype))
    if dtype.kind == "f":
        return rng.standard_normal((2, 3)).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, (2, 3), dtype=dtype, endpoint=True)


@pytest.fixture(scope="module")
def identity_mesh(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("identities")
    for datatype in DATATYPES:
        onnx_models.save(
            onnx_models.identity(datatype), root / f"id_{datatype.lower()}" / "1" / "model.onnx"
        )
    onnx_models.save(onnx_models.reshape_by_three(), root / "by_three" / "1" / "model.onnx")
    running = start_mesh(redis_server.url, root)
    yield running
    running.stop()


@pytest.mark.parametrize("datatype", DATATYPES)
def test_every_datatype_round_trips_through_an_identity_model(
    identity_mesh: Mesh, datatype: str
) -> None:
    model = f"id_{datatype.lower()}"
    x = sample(datatype)
    http = httpclient.InferenceServerClient(identity_mesh.url.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(identity_mesh.grpc_target)
    try:
        tensor = httpclient.InferInput("INPUT0", list(x.shape), datatype)
        tensor.set_data_from_numpy(x)
        over_http = http.infer(model, [tensor]).as_numpy("OUTPUT0")
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), datatype)
        tensor.set_data_from_numpy(x)
        over_grpc = grpc.infer(model, [tensor]).as_numpy("OUTPUT0")
    finally:
        http.close()
        grpc.close()
    if datatype == "BYTES":
        expected = np.vectorize(lambda s: s.encode())(x).astype(np.object_)
        assert over_http.tolist() == expected.tolist()
        assert over_grpc.tolist() == expected.tolist()
    else:
        np.testing.assert_array_equal(over_http, x)
        np.testing.assert_array_equal(over_grpc, x)
        assert over_http.dtype == x.dtype


def test_a_model_without_config_shows_its_completed_config(identity_mesh: Mesh) -> None:
    config = httpx.get(f"{identity_mesh.url}/v2/models/id_fp16/config").json()
    assert config["max_batch_size"] == 4  # Triton's default for a model that can batch
    assert "dynamic_batching" in config
    assert config["input"][0]["data_type"] == "TYPE_FP16"
    assert config["input"][0]["dims"] == [3]


def test_a_batch_the_runtime_rejects_answers_500_and_the_next_is_served(
    identity_mesh: Mesh,
) -> None:
    def send(width: int) -> httpx.Response:
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, width], "data": [1.0] * width}
            ]
        }
        return httpx.post(f"{identity_mesh.url}/v2/models/by_three/infer", json=body, timeout=30)

    failed = send(4)
    assert failed.status_code == 500
    message = failed.json()["error"]
    assert "by_three" in message and "Reshape" in message, message
    served = send(3)
    assert served.status_code == 200, served.text
    assert served.json()["outputs"][0]["shape"] == [1, 3]
