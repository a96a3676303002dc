"""A priority level's own queue policy (Triton's ``priority_queue_policy``) bounds that level.

tiny_mlp with two priority levels, the low one (2) bounded at two waiting requests. With the
batcher stopped, two low-priority requests wait, a third is refused with Triton's words
(503), while high-priority requests are still taken; once the batcher resumes every waiting
request is answered and the level's count is back to zero.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from pathlib import Path

import httpx
import yaml

from tests.conftest import Mesh, connect_sync, private_mesh, wait_queued
from weir import names

LOW_BOUND = 2
ROW = [1.0] * 64


def body(priority: int) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": ROW}],
        "parameters": {"priority": priority},
    }


def repository(example: Path, root: Path) -> Path:
    shutil.copytree(example / "tiny_mlp", root / "tiny_mlp")
    path = root / "tiny_mlp" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config["dynamic_batching"] = {
        "priority_levels": 2,
        "default_priority_level": 1,
        "priority_queue_policy": {2: {"max_queue_size": LOW_BOUND}},
    }
    path.write_text(yaml.safe_dump(config))
    return root


async def fill(mesh: Mesh) -> tuple[httpx.Response, list[int]]:
    url = f"{mesh.url}/v2/models/tiny_mlp/infer"
    batcher = mesh.processes["batcher"]
    async with httpx.AsyncClient(timeout=60) as client:
        batcher.send_signal(signal.SIGSTOP)
        try:
            low = [asyncio.ensure_future(client.post(url, json=body(2))) for _ in range(LOW_BOUND)]
            await asyncio.to_thread(wait_queued, mesh, LOW_BOUND)
            refused = await client.post(url, json=body(2))
            high = [asyncio.ensure_future(client.post(url, json=body(1))) for _ in range(3)]
            await asyncio.to_thread(wait_queued, mesh, LOW_BOUND + 3)
        finally:
            batcher.send_signal(signal.SIGCONT)
        answered = await asyncio.gather(*low, *high)
    return refused, [r.status_code for r in answered]


def test_a_low_priority_level_is_bounded_by_its_own_policy(
    example_repository: Path, tmp_path: Path
) -> None:
    with private_mesh(repository(example_repository, tmp_path / "models")) as mesh:
        refused, statuses = asyncio.run(fill(mesh))
        client = connect_sync(mesh.redis_url)
        counts = client.hgetall(names.level_counts("tiny_mlp", "1"))
        client.close()
    assert refused.status_code == 503
    assert refused.json() == {
        "error": f"request for model 'tiny_mlp' version '1' exceeds maximum queue size {LOW_BOUND}"
    }
    assert statuses == [200] * (LOW_BOUND + 3)
    assert {int(v) for v in counts.values()} <= {0}
