"""Readiness tells the truth: it follows the workers' heartbeats as workers stop and start.

The mesh runs on its own redis-server and a temporary repository holding ``tiny_mlp``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import redis

from tests.conftest import ROOT, Mesh, assert_serves_tiny_mlp, private_mesh, wait_until
from weir import names

# The heartbeat TTL is 3 s and a worker beats every second, so a worker's registry entry left
# behind lives at least 2 s after its last beat: readiness that drops sooner (a probe reuses
# a read up to 0.5 s old) proves the worker left the registry on the way out.
DROP_WITHIN_S = 1.5


@pytest.fixture
def health_mesh(build_models: ModuleType, tmp_path: Path) -> Iterator[Mesh]:
    repository = tmp_path / "models"
    build_models.build_model(repository, "tiny_mlp")
    with private_mesh(repository) as running:
        yield running


def status(mesh: Mesh, path: str) -> int:
    return httpx.get(f"{mesh.url}{path}", timeout=5).status_code


def both_ready(mesh: Mesh) -> tuple[int, int]:
    return status(mesh, "/v2/health/ready"), status(mesh, "/v2/models/tiny_mlp/ready")


def live_workers(mesh: Mesh) -> list[bytes]:
    """The workers in the liveness registry (a stopped one leaves it; nothing reads it here)."""
    with redis.Redis.from_url(mesh.redis_url) as client:
        return list(client.hkeys(names.live_values(names.WORKER_GROUP)))


def start_worker(mesh: Mesh) -> subprocess.Popen[bytes]:
    """A worker pool started the way start_mesh starts one."""
    env = {
        **os.environ,
        "WEIR_REDIS_URL": mesh.redis_url,
        "WEIR_REPOSITORY": str(mesh.repository),
        "WEIR_WORKER_TORCH_THREADS": "1",
    }
    command = [sys.executable, "-m", "weir.cli", "worker", "--pool", "cpu"]
    return subprocess.Popen(command, env=env, cwd=ROOT)


def test_readiness_follows_the_worker_down_and_up(
    health_mesh: Mesh, build_models: ModuleType
) -> None:
    assert both_ready(health_mesh) == (200, 200)
    assert len(live_workers(health_mesh)) == 1

    worker = health_mesh.processes["worker"]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, "the worker did not drain and exit cleanly on SIGTERM"

    wait_until(
        lambda: both_ready(health_mesh) == (503, 503), DROP_WITHIN_S, "readiness to drop to 503"
    )
    assert live_workers(health_mesh) == []
    assert status(health_mesh, "/v2/health/live") == 200

    # Mesh.stop stops whatever is in processes, so the new worker is stopped at the end.
    health_mesh.processes["worker"] = start_worker(health_mesh)
    wait_until(lambda: both_ready(health_mesh) == (200, 200), 60, "readiness to come back")
    assert_serves_tiny_mlp(health_mesh, build_models, rows=3, seed=11)
