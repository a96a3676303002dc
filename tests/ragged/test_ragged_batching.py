"""Triton's ragged batching over the mesh, with TorchScript, ONNX Runtime and OpenVINO.

Requests of different lengths share a batch: the model gets their elements concatenated and
a batch input saying where each ends, and answers each request its own sum and its own
elements (a batch output scattered by the input's shape).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.conftest import Mesh, private_mesh
from tests.ragged.models import write_repository

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with private_mesh(write_repository(tmp_path_factory.mktemp("ragged"))) as running:
        yield running


async def send_all(url: str, rows: list[np.ndarray]) -> list[dict]:  # type: ignore[type-arg]
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(row: np.ndarray) -> dict:  # type: ignore[type-arg]
            body = {
                "inputs": [
                    {
                        "name": "INPUT",
                        "datatype": "FP32",
                        "shape": [1, len(row)],
                        "data": row.tolist(),
                    }
                ]
            }
            response = await client.post(url, json=body)
            assert response.status_code == 200, response.text
            return {o["name"]: o for o in response.json()["outputs"]}

        return await asyncio.gather(*(one(row) for row in rows))


@pytest.mark.parametrize("model", ["ragged_torch", "ragged_onnx", "ragged_openvino"])
def test_requests_of_different_lengths_share_a_batch_and_get_their_own_answers(
    mesh: Mesh, model: str
) -> None:
    rng = np.random.default_rng(11)
    rows = [rng.standard_normal(n).astype(np.float32) for n in [3, 7, 1, 5, 4, 9, 2, 6] * 3]
    answers = asyncio.run(send_all(f"{mesh.url}/v2/models/{model}/infer", rows))
    for row, answer in zip(rows, answers, strict=True):
        assert answer["SUM"]["shape"] == [1, 1]
        np.testing.assert_allclose(answer["SUM"]["data"], [row.sum()], rtol=1e-4, atol=1e-5)
        assert answer["DOUBLED"]["shape"] == [1, len(row)]
        np.testing.assert_allclose(answer["DOUBLED"]["data"], row * 2, rtol=1e-6)
    assert max(answer["COUNT"]["data"][0] for answer in answers) > 1  # batched together
