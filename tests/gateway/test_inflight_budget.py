"""The gateway's in-flight budget: past its requests or bytes, 503 with Retry-After at once,
and what it already holds is answered once the mesh catches up."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import Mesh, private_mesh, wait_queued

ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


async def hold_then_overflow(mesh: Mesh, held: int) -> tuple[httpx.Response, list[int]]:
    """``held`` requests wait on a stopped worker; one more is sent; the worker resumes."""
    url = f"{mesh.url}/v2/models/tiny_mlp/infer"
    worker = mesh.processes["worker"]
    async with httpx.AsyncClient(timeout=60) as client:
        worker.send_signal(signal.SIGSTOP)
        try:
            waiting = [asyncio.ensure_future(client.post(url, json=ROW)) for _ in range(held)]
            await asyncio.to_thread(wait_queued, mesh, held)  # in the mesh before the next
            extra = await client.post(url, json=ROW)
        finally:
            worker.send_signal(signal.SIGCONT)
        answered = await asyncio.gather(*waiting)
    return extra, [r.status_code for r in answered]


@pytest.mark.parametrize(
    ("env", "held", "words"),
    [
        ({"WEIR_GATEWAY_MAX_INFLIGHT_REQUESTS": "3"}, 3, "3 requests in flight"),
        ({"WEIR_GATEWAY_MAX_INFLIGHT_BYTES": "600"}, 2, "512 bytes of requests in flight"),
    ],
    ids=["requests", "bytes"],
)
def test_past_the_budget_a_request_gets_503_and_the_held_ones_are_answered(
    tiny_repository: Path, env: dict[str, str], held: int, words: str
) -> None:
    with private_mesh(tiny_repository, env) as mesh:
        extra, statuses = asyncio.run(hold_then_overflow(mesh, held))
    assert extra.status_code == 503
    assert extra.headers["retry-after"] == "1"
    assert words in extra.json()["error"]
    assert statuses == [200] * held
