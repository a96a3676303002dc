"""Bearer-token authentication over real HTTP: inference and management tokens, open probes.

One mesh for the module, on its own redis-server and a temporary repository holding
``tiny_mlp``, started with both tokens set.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import Mesh, private_mesh

INFERENCE_TOKEN = "infer-secret"
MANAGEMENT_TOKEN = "admin-secret"
INFER = "/v2/models/tiny_mlp/infer"
STATS = "/v2/models/tiny_mlp/stats"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def auth_mesh(build_models: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    repository = tmp_path_factory.mktemp("auth") / "models"
    build_models.build_model(repository, "tiny_mlp")
    tokens = {
        "WEIR_GATEWAY_INFERENCE_TOKEN": INFERENCE_TOKEN,
        "WEIR_GATEWAY_MANAGEMENT_TOKEN": MANAGEMENT_TOKEN,
    }
    with private_mesh(repository, tokens) as running:
        yield running


def tiny_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, 64), dtype=np.float32)


def tiny_reference(build_models: ModuleType, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()


def infer(mesh: Mesh, headers: dict[str, str] | None = None) -> httpx.Response:
    x = tiny_input()
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 64], "data": x.tolist()}]
    }
    return httpx.post(f"{mesh.url}{INFER}", json=body, headers=headers, timeout=30)


def assert_unauthorized(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"]


def test_inference_without_a_token_is_401_in_the_kserve_shape(auth_mesh: Mesh) -> None:
    assert_unauthorized(infer(auth_mesh))


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-secret",
        f"Bearer {INFERENCE_TOKEN}x",
        f"Basic {INFERENCE_TOKEN}",
        INFERENCE_TOKEN,
        "Bearer",
    ],
)
def test_inference_with_a_wrong_token_is_401(auth_mesh: Mesh, authorization: str) -> None:
    assert_unauthorized(infer(auth_mesh, {"Authorization": authorization}))


def test_inference_with_the_inference_token_is_served(
    auth_mesh: Mesh, build_models: ModuleType
) -> None:
    response = infer(auth_mesh, bearer(INFERENCE_TOKEN))

    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, tiny_reference(build_models, tiny_input()), atol=1e-4)


def test_the_bearer_scheme_is_case_insensitive(auth_mesh: Mesh) -> None:
    response = infer(auth_mesh, {"Authorization": f"bearer {INFERENCE_TOKEN}"})

    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2"])
def test_health_and_server_metadata_stay_open(auth_mesh: Mesh, path: str) -> None:
    assert httpx.get(f"{auth_mesh.url}{path}", timeout=10).status_code == 200


@pytest.mark.parametrize(
    "path", ["/v2/models/tiny_mlp", "/v2/models/tiny_mlp/ready", "/v2/models/tiny_mlp/config"]
)
def test_model_routes_need_the_inference_token(auth_mesh: Mesh, path: str) -> None:
    assert_unauthorized(httpx.get(f"{auth_mesh.url}{path}", timeout=10))
    response = httpx.get(f"{auth_mesh.url}{path}", headers=bearer(INFERENCE_TOKEN), timeout=10)
    assert response.status_code == 200, response.text


def test_stats_need_the_management_token_not_the_inference_token(auth_mesh: Mesh) -> None:
    url = f"{auth_mesh.url}{STATS}"
    assert_unauthorized(httpx.get(url, timeout=10))
    assert_unauthorized(httpx.get(url, headers=bearer(INFERENCE_TOKEN), timeout=10))

    response = httpx.get(url, headers=bearer(MANAGEMENT_TOKEN), timeout=10)

    assert response.status_code == 200, response.text
    (stats,) = response.json()["model_stats"]
    assert stats["name"] == "tiny_mlp"


def test_tritonclient_sends_the_token_in_headers(auth_mesh: Mesh, build_models: ModuleType) -> None:
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    x = tiny_input()
    client = triton.InferenceServerClient(auth_mesh.url.removeprefix("http://"))
    try:
        tensor = triton.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)

        result = client.infer("tiny_mlp", [tensor], headers=bearer(INFERENCE_TOKEN))
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT0"), tiny_reference(build_models, x), atol=1e-4
        )

        with pytest.raises(InferenceServerException, match="bearer token"):
            client.infer("tiny_mlp", [tensor])
    finally:
        client.close()


@pytest.mark.parametrize("empty", ["", "   "])
def test_an_empty_token_setting_is_no_token(monkeypatch: pytest.MonkeyPatch, empty: str) -> None:
    # Else `Authorization: Bearer ` (an empty bearer) would be let in as if it were a secret.
    from gateway.auth import Scope, required_token
    from weir.settings import GatewaySettings

    monkeypatch.setenv("WEIR_GATEWAY_INFERENCE_TOKEN", empty)
    monkeypatch.setenv("WEIR_GATEWAY_MANAGEMENT_TOKEN", empty)
    settings = GatewaySettings()
    assert settings.inference_token is None and settings.management_token is None
    assert required_token(settings, Scope.INFERENCE) is None
    assert required_token(settings, Scope.MANAGEMENT) is None
