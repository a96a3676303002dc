"""Triton's raw binary request over real HTTP: ``Inference-Header-Content-Length: 0``.

The body is the one input's data; its name, datatype and shape come from the model's config
(a batch of one when the model batches, one variable dim sized from the body); a BYTES
input is one element, the body itself. Every output comes back as binary data, read here by
tritonclient's own response parser and compared with the model run in-process. tritonclient
always sends a JSON header, so the requests are raw HTTP.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import orjson
import pytest
import torch
import tritonclient.http as httpclient

from tests.conftest import Mesh, start_mesh
from tests.weir import onnx_models
from weir.redis_server import RedisServer
from weir.repository import Repository
from workers.backends import load_backend

RAW = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}


def post_raw(url: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(url, content=content, headers={**RAW, **headers}, timeout=30)


def read_result(response: httpx.Response) -> httpclient.InferResult:
    """The response as tritonclient reads it: a JSON header, then binary outputs."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    header = orjson.loads(response.content[:length])
    assert all("binary_data_size" in o["parameters"] for o in header["outputs"])
    return httpclient.InferenceServerClient.parse_response_body(
        response.content, header_length=length
    )


def run_in_process(
    repository: Path, model: str, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    entry = Repository.load(repository).models[model]
    return load_backend(entry.config, entry.version_path("1")).infer(inputs)


# --- the example models, on the session mesh ---------------------------------------------


def test_a_raw_fp32_body_is_one_row_of_the_batching_models_input(
    mesh: Mesh, build_models: ModuleType
) -> None:
    row = np.random.default_rng(20).standard_normal(64, dtype=np.float32)
    result = read_result(post_raw(f"{mesh.url}/v2/models/tiny_mlp/infer", row.tobytes()))
    got = result.as_numpy("OUTPUT0")
    assert got.shape == (1, 16)  # max_batch_size 64: a batch of one, then dims [64]
    with torch.inference_mode():
        want = build_models.reference_module("tiny_mlp")(torch.from_numpy(row[None])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_raw_bytes_body_is_one_element_and_every_output_is_answered(mesh: Mesh) -> None:
    text = "Un corps brut, lu comme la donnée de l'entrée.".encode()  # UTF-8, not ASCII
    result = read_result(post_raw(f"{mesh.url}/v2/models/minilm_tokenizer/infer", text))
    want = run_in_process(mesh.repository, "minilm_tokenizer", {"TEXT": np.array([[text]], object)})
    for name in ("input_ids", "attention_mask"):  # none asked for: all of them, as binary
        assert result.as_numpy(name).shape == (1, 128)
        np.testing.assert_array_equal(result.as_numpy(name), want[name])


def test_a_gzip_raw_body_is_decoded_first(mesh: Mesh, build_models: ModuleType) -> None:
    row = np.random.default_rng(21).standard_normal(64, dtype=np.float32)
    response = post_raw(
        f"{mesh.url}/v2/models/tiny_mlp/infer",
        gzip.compress(row.tobytes()),
        **{"Content-Encoding": "gzip"},
    )
    with torch.inference_mode():
        want = build_models.reference_module("tiny_mlp")(torch.from_numpy(row[None])).numpy()
    np.testing.assert_allclose(read_result(response).as_numpy("OUTPUT0"), want, atol=1e-5)


def test_a_raw_body_of_the_wrong_size_is_a_400_naming_the_input(mesh: Mesh) -> None:
    response = post_raw(f"{mesh.url}/v2/models/tiny_mlp/infer", bytes(63 * 4))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error == (
        "input byte size mismatch for input 'INPUT0' for model 'tiny_mlp'. Expected 256, got 252"
    )


def test_a_raw_body_for_a_model_with_two_inputs_is_a_400(mesh: Mesh) -> None:
    response = post_raw(f"{mesh.url}/v2/models/minilm_encoder/infer", bytes(8 * 128))
    assert response.status_code == 400
    assert response.json()["error"] == (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in "
        "'minilm_encoder' model configuration"
    )


# --- variable dims and shapes Triton cannot deduce, on a mesh of their own ------------------


@pytest.fixture(scope="module")
def shapes_mesh(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("raw")
    models = {
        # name: (datatype, ONNX dims, config dims, max_batch_size)
        "rows": ("FP32", ("batch", None, 4), "[ -1, 4 ]", 8),
        "vector": ("INT32", (None,), "[ -1 ]", 0),
        "two_variable": ("FP32", (None, None), "[ -1, -1 ]", 0),
        "two_strings": ("BYTES", (2,), "[ 2 ]", 0),
    }
    for name, (datatype, onnx_dims, dims, max_batch) in models.items():
        onnx_models.save(
            onnx_models.identity(datatype, onnx_dims), root / name / "1" / "model.onnx"
        )
        kind = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
        (root / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch}\n'
            f'input [{{ name: "INPUT0", data_type: {kind}, dims: {dims} }}]\n'
            f'output [{{ name: "OUTPUT0", data_type: {kind}, dims: {dims} }}]\n'
        )
    running = start_mesh(redis_server.url, root)
    yield running
    running.stop()


@pytest.mark.parametrize(
    ("model", "data", "shape"),
    [
        ("rows", np.arange(12, dtype=np.float32).reshape(3, 4), (1, 3, 4)),
        ("vector", np.arange(5, dtype=np.int32), (5,)),
    ],
    ids=["batched-rows", "unbatched-vector"],
)
def test_the_variable_dim_is_sized_from_the_body(
    shapes_mesh: Mesh, model: str, data: np.ndarray, shape: tuple[int, ...]
) -> None:
    response = post_raw(f"{shapes_mesh.url}/v2/models/{model}/infer", data.tobytes())
    got = read_result(response).as_numpy("OUTPUT0")
    want = run_in_process(shapes_mesh.repository, model, {"INPUT0": data.reshape(shape)})
    assert got.shape == shape
    np.testing.assert_array_equal(got, want["OUTPUT0"])


def test_a_body_that_is_not_whole_rows_is_a_400(shapes_mesh: Mesh) -> None:
    response = post_raw(f"{shapes_mesh.url}/v2/models/rows/infer", bytes(4 * 6))
    assert response.status_code == 400
    error = response.json()["error"]
    assert "input byte size mismatch for input 'INPUT0' for model 'rows'" in error
    assert "got 24" in error


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            "two_variable",
            "The shape of the raw input 'INPUT0' can not be deduced because there are more "
            "than one variable-sized dimension",
        ),
        (
            "two_strings",
            "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
    ],
)
def test_a_shape_triton_cannot_deduce_is_a_400_in_its_words(
    shapes_mesh: Mesh, model: str, message: str
) -> None:
    response = post_raw(f"{shapes_mesh.url}/v2/models/{model}/infer", bytes(16))
    assert response.status_code == 400
    assert response.json() == {"error": message}
