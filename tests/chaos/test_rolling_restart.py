"""A rolling restart of every service under load fails no request.

Each service is replaced the way an orchestrator does it: the new instance starts, then the
old one gets SIGTERM and drains (a gateway is first taken out of the load balancer).
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import redis
import torch

from tests.chaos.helpers import Topology, closed_loop, private_repository
from tests.conftest import http_ready, wait_until
from weir import names
from weir.redis_server import RedisServer, free_port


def live_count(client: redis.Redis, group: str) -> int:
    """The consumers of ``group`` whose beat has not expired, by Redis's clock."""
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    return int(client.zcount(names.live_expiry(group), f"({now_ms}", "+inf"))


def replace(mesh: Topology, old, service: str, name: str, ready, **env: str):  # type: ignore[no-untyped-def]
    new = mesh.start(service, name, **env)
    wait_until(ready, 60, f"{name} to be up")
    old.send_signal(signal.SIGTERM)
    assert old.wait(30) == 0, f"{service} did not drain and exit cleanly"
    return new


@pytest.mark.timeout(120)
def test_rolling_restart_of_every_service_fails_no_request(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    rows = np.random.default_rng(11).standard_normal((64, 64), dtype=np.float32)
    with torch.inference_mode():
        expected = build_models.reference_module("tiny_mlp")(torch.from_numpy(rows)).numpy()
    ports = [free_port(), free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with RedisServer() as server:
        mesh = Topology(server.url, repository, tmp_path, {"WEIR_HEARTBEAT_TTL_S": "1"})
        client = redis.Redis.from_url(server.url)
        try:
            batcher = mesh.start("batcher", "batcher-1")
            worker = mesh.start("worker", "worker-1")
            gateway = mesh.start("gateway", "gateway-1", WEIR_GATEWAY_HTTP_PORT=str(ports[0]))
            mesh.start("gateway", "gateway-2", WEIR_GATEWAY_HTTP_PORT=str(ports[1]))
            for url in urls[:2]:
                wait_until(lambda u=url: http_ready(f"{u}/v2/health/ready"), 60, "the mesh")
            balanced = urls[:2]
            in_flight: dict[str, int] = {}

            async def run() -> list:  # type: ignore[type-arg]
                stop = asyncio.Event()
                load = asyncio.create_task(
                    closed_loop(
                        lambda: balanced, "tiny_mlp", rows, 8, stop, 100_000, None, in_flight
                    )
                )
                await asyncio.to_thread(restart_all)
                await asyncio.sleep(0.5)  # keep the load on the new topology for a moment
                stop.set()
                return await load

            def restart_all() -> None:
                replace(mesh, worker, "worker", "worker-2",
                        lambda: live_count(client, "workers") == 2)  # fmt: skip
                replace(mesh, batcher, "batcher", "batcher-2",
                        lambda: live_count(client, "batcher") == 2)  # fmt: skip
                mesh.start("gateway", "gateway-3", WEIR_GATEWAY_HTTP_PORT=str(ports[2]))
                wait_until(lambda: http_ready(f"{urls[2]}/v2/health/ready"), 60, "gateway-3")
                # Like a load balancer: take it out of rotation, let what it has finish.
                balanced[:] = urls[1:]
                wait_until(lambda: in_flight.get(urls[0], 0) == 0, 10, "gateway-1 to be idle")
                gateway.send_signal(signal.SIGTERM)
                assert gateway.wait(30) == 0

            outcomes = asyncio.run(run())
            print(f"rolling restart: {len(outcomes)} sent, "
                  f"{sum(o.status == 200 for o in outcomes)} answered 200")  # fmt: skip
            failures = [(o.status, o.error) for o in outcomes if o.status != 200]
            assert failures == []
            assert len(outcomes) > 200
            for outcome in outcomes:
                np.testing.assert_allclose(outcome.output, expected[outcome.row], atol=1e-5)
        finally:
            mesh.stop_all()
