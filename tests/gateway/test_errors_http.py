"""Every bad request gets its status and a KServe-shaped error, before anything is queued."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import BODY_LIMIT_BYTES, Mesh


def tiny_input(**overrides: Any) -> dict[str, Any]:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}
    tensor.update(overrides)
    return tensor


BAD_REQUESTS = [
    pytest.param({"inputs": []}, "no inputs", id="no-inputs"),
    pytest.param({"inputs": [tiny_input(name="INPUT9")]}, "INPUT9", id="misnamed-input"),
    pytest.param(
        {"inputs": [tiny_input(), tiny_input(name="EXTRA")]}, "unexpected input 'EXTRA'", id="extra"
    ),
    pytest.param(
        {"inputs": [tiny_input(datatype="FP64")]}, "input 'INPUT0' has datatype FP64", id="datatype"
    ),
    pytest.param(
        {"inputs": [tiny_input(shape=[1, 32], data=[0.0] * 32)]}, "got [1,32]", id="shape"
    ),
    pytest.param(
        {"inputs": [tiny_input(shape=[1, 64], data=[0.0] * 63)]}, "data has 63", id="element-count"
    ),
    pytest.param(
        {"inputs": [tiny_input(shape=[65, 64], data=[0.0] * 65 * 64)]},
        "max_batch_size",
        id="batch-over-max",
    ),
    pytest.param(
        {"inputs": [tiny_input(datatype="FLOAT")]}, "unknown datatype", id="unknown-dtype"
    ),
    pytest.param(
        {"inputs": [tiny_input(data=["x"] * 64)]}, "not a valid FP32 value", id="wrong-json-type"
    ),
    pytest.param(
        {"inputs": [tiny_input()], "outputs": [{"name": "NOPE"}]},
        "unknown output 'NOPE'",
        id="output",
    ),
]


@pytest.mark.parametrize(("body", "message"), BAD_REQUESTS)
def test_invalid_request_is_a_400_naming_the_problem(
    mesh: Mesh, body: dict[str, Any], message: str
) -> None:
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error"}
    assert message in response.json()["error"]


def test_malformed_json_is_a_400(mesh: Mesh) -> None:
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", content=b"{not json")
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (
            "/v2/models/no_such_model/infer",
            "Request for unknown model: 'no_such_model' is not found",
        ),
        ("/v2/models/tiny_mlp/versions/7/infer", "'tiny_mlp' version 7 is not found"),
    ],
)
def test_unknown_model_or_version_is_a_404(mesh: Mesh, path: str, message: str) -> None:
    response = httpx.post(f"{mesh.url}{path}", json={"inputs": [tiny_input()]})
    assert response.status_code == 404
    assert message in response.json()["error"]


def test_body_over_the_limit_is_a_413(mesh: Mesh) -> None:
    response = httpx.post(
        f"{mesh.url}/v2/models/tiny_mlp/infer", content=b" " * (BODY_LIMIT_BYTES + 1)
    )
    assert response.status_code == 413
    assert str(BODY_LIMIT_BYTES) in response.json()["error"]


def test_body_over_the_limit_without_content_length_is_a_413(mesh: Mesh) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(BODY_LIMIT_BYTES // 65536 + 2):
            yield b" " * 65536

    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", content=chunks())
    assert response.status_code == 413


def test_unknown_route_uses_the_error_shape(mesh: Mesh) -> None:
    response = httpx.get(f"{mesh.url}/v2/nothing/here")
    assert response.status_code == 404
    assert set(response.json()) == {"error"}


def test_the_mesh_still_serves_after_bad_requests(mesh: Mesh) -> None:
    for body, _ in (p.values for p in BAD_REQUESTS):
        httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body)
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json={"inputs": [tiny_input()]})
    assert response.status_code == 200
