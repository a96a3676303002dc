"""Redis that stops answering without closing its connections (SIGSTOP, as a half-open
socket after a network partition): requests get their 504 at their deadline instead of
hanging, and the mesh serves again on its own once Redis answers."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.chaos.helpers import Topology, private_repository, tiny_body
from tests.conftest import wait_until
from weir.redis_server import RedisServer, free_port


@pytest.mark.timeout(120)
def test_a_paused_redis_costs_requests_their_deadline_not_forever(
    tmp_path: Path, example_repository: Path
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    port = free_port()
    url = f"http://127.0.0.1:{port}/v2/models/tiny_mlp/infer"
    row = np.random.default_rng(9).standard_normal(64, dtype=np.float32)
    body = tiny_body(row)
    server = RedisServer().start()
    assert server.process is not None
    mesh = Topology(server.url, repository, tmp_path, {"WEIR_REDIS_TIMEOUT_S": "1"})
    try:
        mesh.start_mesh(port)
        assert httpx.post(url, json=body, timeout=10).status_code == 200

        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            paused = httpx.post(url, json={**body, "parameters": {"timeout": 500_000}}, timeout=10)
            waited_s = time.monotonic() - started
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert paused.status_code == 504, paused.text
        assert "within 0.5 s" in paused.json()["error"]
        assert waited_s < 2.0

        def serves() -> bool:
            try:
                return httpx.post(url, json=body, timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(serves, 30, "serving to resume after Redis answers again")
    finally:
        mesh.stop_all()
        server.stop()
