"""Protocol corners as Triton answers them, with tritonclient unmodified where it sends them.

``timeout: 0`` is no timeout; a duplicate requested output is a 400; the classification
extension answers an output as its top-K ``"value:index[:label]"`` strings; unknown models
and versions and wrong shapes are reported in Triton's words.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import Mesh, start_mesh
from tests.weir import onnx_models
from weir.redis_server import RedisServer

LABELS = ["cat", "dog", "emu", "fox"]


def tiny_input(rows: int = 2) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, 64), dtype=np.float32)


def tiny_reference(build_models: ModuleType, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()


def http_input(x: np.ndarray) -> httpclient.InferInput:
    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def grpc_input(x: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def test_timeout_zero_means_no_timeout(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    build_models: ModuleType,
) -> None:
    x = tiny_input()
    expected = tiny_reference(build_models, x)
    over_http = triton_http.infer("tiny_mlp", [http_input(x)], timeout=0).as_numpy("OUTPUT0")
    over_grpc = triton_grpc.infer("tiny_mlp", [grpc_input(x)], timeout=0).as_numpy("OUTPUT0")
    np.testing.assert_allclose(over_http, expected, atol=1e-5)
    np.testing.assert_allclose(over_grpc, expected, atol=1e-5)


def test_a_negative_timeout_is_refused(mesh: Mesh) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}],
        "parameters": {"timeout": -1},
    }
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body)
    assert response.status_code == 400
    assert "timeout" in response.json()["error"]


def test_a_duplicate_requested_output_is_a_400(
    triton_http: httpclient.InferenceServerClient, triton_grpc: grpcclient.InferenceServerClient
) -> None:
    x = tiny_input()
    twice = [httpclient.InferRequestedOutput("OUTPUT0")] * 2
    with pytest.raises(InferenceServerException) as info:
        triton_http.infer("tiny_mlp", [http_input(x)], outputs=twice)
    assert info.value.status() == "400"
    assert "output 'OUTPUT0' is requested more than once" in info.value.message()
    with pytest.raises(InferenceServerException, match="more than once"):
        triton_grpc.infer(
            "tiny_mlp", [grpc_input(x)], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")] * 2
        )


def expected_classes(
    values: np.ndarray, count: int, labels: list[str] | None = None
) -> list[list[bytes]]:
    rows = []
    for row in values.reshape(values.shape[0], -1):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        names = [f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "") for i in order]
        rows.append([n.encode() for n in names])
    return rows


def test_classification_returns_the_top_classes_over_http_and_grpc(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    build_models: ModuleType,
) -> None:
    x = tiny_input(rows=3)
    want = expected_classes(tiny_reference(build_models, x), 5)
    for binary in (True, False):
        wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=5)
        result = triton_http.infer("tiny_mlp", [http_input(x)], outputs=[wanted])
        classes = result.as_numpy("OUTPUT0")
        assert classes.shape == (3, 5)
        assert [[c if isinstance(c, bytes) else c.encode() for c in row] for row in classes] == want
    wanted_grpc = grpcclient.InferRequestedOutput("OUTPUT0", class_count=5)
    classes = triton_grpc.infer("tiny_mlp", [grpc_input(x)], outputs=[wanted_grpc]).as_numpy(
        "OUTPUT0"
    )
    assert classes.tolist() == want


def test_classification_of_more_classes_than_values_gives_every_value(
    triton_http: httpclient.InferenceServerClient, build_models: ModuleType
) -> None:
    x = tiny_input(rows=1)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", class_count=100)
    classes = triton_http.infer("tiny_mlp", [http_input(x)], outputs=[wanted]).as_numpy("OUTPUT0")
    assert classes.shape == (1, 16)


@pytest.fixture(scope="module")
def labelled_mesh(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("labelled")
    onnx_models.save(onnx_models.identity("FP32", (4,)), root / "scores" / "1" / "model.onnx")
    (root / "scores" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (root / "scores" / "config.pbtxt").write_text(
        'name: "scores"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }]\n'
        'output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ],'
        ' label_filename: "labels.txt" }]\n'
    )
    running = start_mesh(redis_server.url, root)
    yield running
    running.stop()


def test_classification_names_classes_from_the_outputs_label_file(labelled_mesh: Mesh) -> None:
    client = httpclient.InferenceServerClient(labelled_mesh.url.removeprefix("http://"))
    try:
        x = np.array([0.1, 0.7, 0.05, 0.15], dtype=np.float32)
        wanted = httpclient.InferRequestedOutput("OUTPUT0", class_count=2)
        classes = client.infer("scores", [http_input(x)], outputs=[wanted]).as_numpy("OUTPUT0")
    finally:
        client.close()
    # A model without a batch dimension: K classes, shape [K].
    assert classes.tolist() == [b"0.700000:1:dog", b"0.150000:3:fox"]
    config = httpx.get(f"{labelled_mesh.url}/v2/models/scores/config").json()
    assert config["output"][0]["label_filename"] == "labels.txt"


def test_classification_of_a_bytes_output_is_refused_as_triton_does() -> None:
    from gateway.classification import classify
    from weir.tensors import Tensor

    tensor = Tensor.from_numpy(np.array([b"a", b"b"], dtype=object))
    with pytest.raises(
        Exception, match="class result not available for output due to unsupported type 'BYTES'"
    ):
        classify(tensor, 1, False, ())


def test_errors_use_tritons_words(
    triton_http: httpclient.InferenceServerClient, triton_grpc: grpcclient.InferenceServerClient
) -> None:
    x = tiny_input()
    with pytest.raises(InferenceServerException) as info:
        triton_http.infer("no_such_model", [http_input(x)])
    assert info.value.message() == "Request for unknown model: 'no_such_model' is not found"
    with pytest.raises(InferenceServerException) as info:
        triton_grpc.infer("tiny_mlp", [grpc_input(x)], model_version="7")
    assert "Request for unknown model: 'tiny_mlp' version 7 is not found" in info.value.message()
    narrow = np.zeros((1, 8), dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        triton_http.infer("tiny_mlp", [http_input(narrow)])
    assert info.value.message().startswith(
        "unexpected shape for input 'INPUT0' for model 'tiny_mlp'. Expected [-1,64], got [1,8]"
    )
