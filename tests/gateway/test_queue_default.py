"""A model whose config sets no max_queue_size is bounded by the gateway's default
(WEIR_GATEWAY_DEFAULT_MAX_QUEUE_SIZE): past it 503 with Retry-After, Triton's words, and
what was queued is answered once the worker resumes."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx

from tests.conftest import Mesh, private_mesh, wait_queued

DEFAULT = 3
ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


async def fill_then_overflow(mesh: Mesh) -> tuple[httpx.Response, list[int]]:
    """DEFAULT requests wait on a stopped worker; one more is sent; the worker resumes."""
    url = f"{mesh.url}/v2/models/tiny_mlp/infer"
    worker = mesh.processes["worker"]
    async with httpx.AsyncClient(timeout=60) as client:
        worker.send_signal(signal.SIGSTOP)
        try:
            waiting = [asyncio.ensure_future(client.post(url, json=ROW)) for _ in range(DEFAULT)]
            await asyncio.to_thread(wait_queued, mesh, DEFAULT)
            extra = await client.post(url, json=ROW)
        finally:
            worker.send_signal(signal.SIGCONT)
        answered = await asyncio.gather(*waiting)
    return extra, [r.status_code for r in answered]


def test_a_model_without_max_queue_size_refuses_past_the_default(
    tiny_repository: Path,
) -> None:
    env = {"WEIR_GATEWAY_DEFAULT_MAX_QUEUE_SIZE": str(DEFAULT)}
    with private_mesh(tiny_repository, env) as mesh:
        extra, statuses = asyncio.run(fill_then_overflow(mesh))
    assert extra.status_code == 503
    assert extra.headers["retry-after"] == "1"
    assert extra.json() == {
        "error": f"request for model 'tiny_mlp' version '1' exceeds maximum queue size {DEFAULT}"
    }
    assert statuses == [200] * DEFAULT
