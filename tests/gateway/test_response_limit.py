"""A response is bounded before it is rendered: past WEIR_GATEWAY_RESPONSE_LIMIT_BYTES, 413."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import Mesh, private_mesh

LIMIT_BYTES = 1000  # tiny_mlp answers 16 FP32 per row: 64 bytes, so 15 rows fit and 16 do not


@pytest.fixture(scope="module")
def limited(tiny_repository: Path) -> Iterator[Mesh]:
    env = {"WEIR_GATEWAY_RESPONSE_LIMIT_BYTES": str(LIMIT_BYTES)}
    with private_mesh(tiny_repository, env) as mesh:
        yield mesh


def body(rows: int) -> dict[str, object]:
    data = np.ones((rows, 64), dtype=np.float32).tolist()
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 64], "data": data}]}


def test_a_response_within_the_limit_is_served(limited: Mesh) -> None:
    response = httpx.post(f"{limited.url}/v2/models/tiny_mlp/infer", json=body(15), timeout=30)
    assert response.status_code == 200, response.text


def test_a_response_past_the_limit_is_a_413_naming_it(limited: Mesh) -> None:
    response = httpx.post(f"{limited.url}/v2/models/tiny_mlp/infer", json=body(16), timeout=30)
    assert response.status_code == 413
    assert response.json() == {
        "error": "the outputs of model 'tiny_mlp' hold 1024 bytes, over the response limit of "
        "1000 bytes (WEIR_GATEWAY_RESPONSE_LIMIT_BYTES)"
    }


def test_grpc_answers_resource_exhausted(limited: Mesh) -> None:
    client = grpcclient.InferenceServerClient(limited.grpc_target)
    x = np.ones((16, 64), dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("tiny_mlp", [inp])
    assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "over the response limit of 1000 bytes" in str(raised.value.message())
    client.close()
