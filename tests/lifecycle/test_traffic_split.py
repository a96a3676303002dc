"""Requests that name no version are split between versions by the weights the user sets.

The split comes from the config (``parameters { traffic_split: "1:80,2:20" }``) or from Weir's
management call, ``POST /v2/repository/models/{m}/traffic``; each version's statistics count
what it received; a request that names a version always gets that version.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import private_mesh
from tests.lifecycle.helpers import add_version, expected, mlp_config, write_config

REQUESTS = 500
TOLERANCE = 0.06


async def versions_answering(url: str, path: str, count: int) -> Counter[str]:
    row = np.linspace(-1, 1, 16, dtype=np.float32)
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": row.tolist()}
    body = {"inputs": [tensor]}
    limit = asyncio.Semaphore(16)

    async def one(client: httpx.AsyncClient) -> str:
        async with limit:
            response = await client.post(f"{url}{path}", json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        version = str(reply["model_version"])
        got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(got, expected(version, row), atol=1e-4)
        return version

    async with httpx.AsyncClient(timeout=60) as client:
        return Counter(await asyncio.gather(*(one(client) for _ in range(count))))


async def set_weights(url: str, weights: dict[str, int]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(
            f"{url}/v2/repository/models/ab/traffic", json={"weights": weights}
        )


def received(url: str, model: str) -> dict[str, int]:
    stats = httpx.get(f"{url}/v2/models/{model}/stats", timeout=10).json()["model_stats"]
    return {s["version"]: s["inference_stats"]["success"]["count"] for s in stats}


@pytest.fixture(scope="module")
def split_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("split")
    config = mlp_config(
        "ab",
        version_policy={"all": {}},
        parameters={"traffic_split": {"string_value": "1:80,2:20"}},
    )
    write_config(root / "ab", config)
    add_version(root / "ab", 1)
    add_version(root / "ab", 2)
    return root


@pytest.mark.timeout(180)
async def test_weights_from_the_config_and_the_api_split_requests(split_repository: Path) -> None:
    env = {"WEIR_MODEL_CONTROL_MODE": "explicit", "WEIR_LOAD_MODEL": "ab"}
    with private_mesh(split_repository, env) as mesh:
        counts = await versions_answering(mesh.url, "/v2/models/ab/infer", REQUESTS)
        assert abs(counts["1"] / REQUESTS - 0.8) <= TOLERANCE, counts
        assert abs(counts["2"] / REQUESTS - 0.2) <= TOLERANCE, counts
        assert await asyncio.to_thread(received, mesh.url, "ab") == {
            "1": counts["1"],
            "2": counts["2"],
        }

        pinned = await versions_answering(mesh.url, "/v2/models/ab/versions/2/infer", 50)
        assert pinned == {"2": 50}

        response = await set_weights(mesh.url, {"1": 1, "2": 3})
        assert response.status_code == 200, response.text
        counts = await versions_answering(mesh.url, "/v2/models/ab/infer", REQUESTS)
        assert abs(counts["2"] / REQUESTS - 0.75) <= TOLERANCE, counts

        bad = await set_weights(mesh.url, {"7": 1})
        assert bad.status_code == 400
        assert "versions 7, which are not served" in bad.json()["error"]
