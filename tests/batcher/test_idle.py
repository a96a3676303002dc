"""A batcher with nothing to batch waits; it does not spin.

In a model control mode a batcher may start before any model is loaded: it has no stream to
read, and a read of no streams returns at once. Looping on it held the event loop, burned a
core and starved the task that follows the desired state, so a model loaded then was
batched late (seconds on a busy machine).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from tests.chaos.helpers import Topology
from tests.conftest import wait_until
from weir.redis_server import RedisServer

WINDOW_S = 2.0


def test_a_batcher_serving_no_model_stays_idle(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with RedisServer() as server:
        topology = Topology(
            server.url, tmp_path / "models", tmp_path, {"WEIR_MODEL_CONTROL_MODE": "explicit"}
        )
        try:
            batcher = psutil.Process(topology.start("batcher", "batcher").pid)
            wait_until(lambda: "reading 0 request streams" in topology.log("batcher"), 30, "start")
            before = batcher.cpu_times()
            time.sleep(WINDOW_S)  # a measurement window, not a wait for a condition
            after = batcher.cpu_times()
        finally:
            topology.stop_all()
    busy_s = (after.user + after.system) - (before.user + before.system)
    assert busy_s < 0.25 * WINDOW_S, f"{busy_s:.2f} s of CPU in {WINDOW_S} s with nothing to do"
