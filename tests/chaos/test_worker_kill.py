"""A worker killed with SIGKILL mid-batch loses nothing: a live worker reclaims its batches."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest
import redis
import torch

from tests.chaos.helpers import Topology, private_repository, request
from tests.conftest import http_ready, wait_until
from weir.redis_server import RedisServer, free_port

BATCHES = "weir:{wide_mlp}:1:batches"


def pending_of(client: redis.Redis, consumer: str) -> int:
    summary = client.xpending(BATCHES, "workers")
    owners = {c["name"].decode(): int(c["pending"]) for c in summary["consumers"] or []}
    return owners.get(consumer, 0)


def freeze_holding_a_batch(client: redis.Redis, process, consumer: str) -> None:  # type: ignore[no-untyped-def]
    """SIGSTOP the worker at a moment it holds a delivered, unacked batch."""

    def frozen_with_batch() -> bool:
        process.send_signal(signal.SIGSTOP)
        if pending_of(client, consumer) > 0:
            return True
        process.send_signal(signal.SIGCONT)
        return False

    wait_until(frozen_with_batch, 20, "the worker to hold a batch", interval_s=0.01)


@pytest.mark.timeout(90)
def test_sigkill_mid_batch_answers_all_200_requests(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["wide_mlp"])
    rows = np.random.default_rng(7).standard_normal((200, 1024), dtype=np.float32)
    with torch.inference_mode():
        expected = build_models.reference_module("wide_mlp")(torch.from_numpy(rows)).numpy()
    port = free_port()
    with RedisServer() as server:
        mesh = Topology(
            server.url,
            repository,
            tmp_path,
            {"WEIR_HEARTBEAT_TTL_S": "1", "WEIR_WORKER_RECLAIM_IDLE_MS": "200",
             "WEIR_WORKER_RECLAIM_INTERVAL_S": "0.2"},
        )  # fmt: skip
        try:
            mesh.start("batcher", "batcher")
            victim = mesh.start("worker", "worker-a", WEIR_WORKER_NAME="a")
            mesh.start("worker", "worker-b", WEIR_WORKER_NAME="b")
            mesh.start("gateway", "gateway", WEIR_GATEWAY_HTTP_PORT=str(port))
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: http_ready(f"{url}/v2/health/ready"), 60, "the mesh")
            client = redis.Redis.from_url(server.url)

            async def run() -> list:  # type: ignore[type-arg]
                async with httpx.AsyncClient(timeout=60) as http:
                    sending = asyncio.gather(
                        *(request(http, url, "wide_mlp", rows, i) for i in range(200))
                    )
                    await asyncio.to_thread(freeze_holding_a_batch, client, victim, "cpu-a")
                    held = pending_of(client, "cpu-a")
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    return [held, await sending]

            held, outcomes = asyncio.run(run())
            print(f"worker kill: {len(outcomes)} sent, {sum(o.status == 200 for o in outcomes)} "
                  f"answered 200, killed worker held {held} batch(es)")  # fmt: skip
            assert held > 0
            assert [(o.status, o.error) for o in outcomes if o.status != 200] == []
            assert len(outcomes) == 200
            for outcome in outcomes:
                np.testing.assert_allclose(outcome.output, expected[outcome.row], atol=1e-4)
            assert pending_of(client, "cpu-a") == 0
            assert "from dead workers" in mesh.log("worker-b")
        finally:
            mesh.stop_all()
