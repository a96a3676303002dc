"""Request parameters are bounded: past WEIR_GATEWAY_MAX_PARAMETERS(_BYTES) a request is a 400
(gRPC INVALID_ARGUMENT) and never reaches the mesh, while valid requests beside it are served.

The session mesh runs with the defaults: 64 parameters, 64 KiB.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gateway.codec import check_parameter_size
from tests.conftest import Mesh
from weir import names
from weir.errors import InvalidInput

MAX_BYTES = 64 * 1024
MAX_COUNT = 64
ROW = [1.0] * 64


def body(parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": ROW}]
    }
    if parameters is not None:
        request["parameters"] = parameters
    return request


def test_no_or_few_parameters_pass() -> None:
    check_parameter_size({}, 0, 0)
    check_parameter_size({"priority": 1, "timeout": 5, "tag": "a"}, MAX_COUNT, MAX_BYTES)


def test_the_size_counts_names_and_utf8_values_and_8_per_number() -> None:
    check_parameter_size({"k": "x" * 9, "n": 1}, 2, 1 + 9 + 1 + 8)
    with pytest.raises(InvalidInput, match="19 bytes, more than the 18"):
        check_parameter_size({"k": "x" * 9, "n": 1}, 2, 18)
    # Three UTF-8 bytes a character, not one: the bound is on what travels.
    with pytest.raises(InvalidInput, match="WEIR_GATEWAY_MAX_PARAMETERS_BYTES"):
        check_parameter_size({"k": "€" * 10}, 1, 20)


def test_more_parameters_than_the_count_are_refused() -> None:
    with pytest.raises(InvalidInput, match=r"3 parameters, more than the 2 .*MAX_PARAMETERS\)"):
        check_parameter_size({"a": 1, "b": 2, "c": 3}, 2, MAX_BYTES)


def request_stream_length(mesh: Mesh) -> int:
    with redis.Redis.from_url(mesh.redis_url) as client:
        return int(client.xlen(names.request_stream("tiny_mlp", "1")))


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"big": "p" * MAX_BYTES}, "WEIR_GATEWAY_MAX_PARAMETERS_BYTES"),
        ({f"p{i}": i for i in range(MAX_COUNT + 1)}, "WEIR_GATEWAY_MAX_PARAMETERS)"),
    ],
    ids=["bytes", "count"],
)
def test_http_oversized_parameters_get_400_while_a_valid_request_is_served(
    mesh: Mesh, parameters: dict[str, Any], words: str
) -> None:
    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=mesh.url, timeout=30) as client:
            url = "/v2/models/tiny_mlp/infer"
            return await asyncio.gather(
                client.post(url, json=body(parameters)), client.post(url, json=body({"a": "b"}))
            )

    before = request_stream_length(mesh)
    refused, served = asyncio.run(both())
    assert refused.status_code == 400
    assert set(refused.json()) == {"error"}
    assert words in refused.json()["error"]
    assert served.status_code == 200, served.text
    # Only the valid request was queued (the stream keeps entries until it is trimmed).
    assert request_stream_length(mesh) - before <= 1


def test_grpc_oversized_parameters_get_invalid_argument(mesh: Mesh) -> None:
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    try:
        infer_input = grpcclient.InferInput("INPUT0", [1, 64], "FP32")
        infer_input.set_data_from_numpy(np.ones((1, 64), dtype=np.float32))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tiny_mlp", [infer_input], parameters={"big": "p" * MAX_BYTES})
        assert refused.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
        assert "WEIR_GATEWAY_MAX_PARAMETERS_BYTES" in refused.value.message()
        served = client.infer("tiny_mlp", [infer_input], parameters={"a": "b"})
        assert served.as_numpy("OUTPUT0").shape == (1, 16)
    finally:
        client.close()
