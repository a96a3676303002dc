"""A worker runs quick batches in its event loop and slow ones in an executor thread.

Handing a batch to a thread and back costs tens of microseconds, more than a small model
computes; a slow batch in the event loop would stall reads, writes and heartbeats. The worker
times each lane's batches, in CPU time and in wall time: a model of one instance runs in the
loop while its batches take less than ``inline_block_us`` (wall: a batch that sleeps or waits
goes to a thread), a model of several instances only while they also cost less than
``inline_compute_us`` of CPU time (threads let its instances compute side by side).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import Mesh, start_mesh
from weir.redis_server import RedisServer

# Answers each row with the name of the thread that ran the batch, after sleeping sleep_ms
# and then computing for spin_ms of its thread's CPU time.
HANDLER = """
import threading
import time

import numpy as np


class Where:
    def initialize(self, context):
        self.sleep_s = float(context.parameters.get("sleep_ms", "0")) / 1000
        self.spin_s = float(context.parameters.get("spin_ms", "0")) / 1000

    def preprocess(self, batch):
        return batch["X"]

    def inference(self, x):
        time.sleep(self.sleep_s)
        spun = time.thread_time() + self.spin_s
        while time.thread_time() < spun:
            pass
        return x

    def postprocess(self, x):
        name = threading.current_thread().name.encode()
        return {"THREAD": np.array([[name]] * len(x), dtype=object)}
"""


def write_model(
    repository: Path, name: str, sleep_ms: int, spin_ms: int = 0, instances: int = 1
) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(HANDLER))
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "THREAD", "data_type": "TYPE_STRING", "dims": [1]}],
        "parameters": {"sleep_ms": str(sleep_ms), "spin_ms": str(spin_ms)},
        "instance_group": [{"kind": "KIND_CPU", "count": instances}],
    }
    (repository / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def inline_mesh(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mesh]:
    repository = tmp_path_factory.mktemp("inline") / "models"
    write_model(repository, "quick", 0)
    write_model(repository, "quick_pair", 0, instances=2)
    write_model(repository, "slow", 50)  # little CPU time, wall time past the limit
    write_model(repository, "busy", 0, 8)  # CPU time past the limit, wall time under it
    write_model(repository, "busy_pair", 0, 8, instances=2)
    settings = {"WEIR_WORKER_INLINE_COMPUTE_US": "5000", "WEIR_WORKER_INLINE_BLOCK_US": "30000"}
    mesh = start_mesh(redis_server.url, repository, settings)
    yield mesh
    mesh.stop()


def threads_used(mesh: Mesh, model: str, requests: int) -> list[str]:
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
    names = []
    with httpx.Client(base_url=mesh.url, timeout=30) as client:
        for _ in range(requests):
            response = client.post(f"/v2/models/{model}/infer", json=body)
            assert response.status_code == 200, response.text
            names.append(response.json()["outputs"][0]["data"][0])
    return names


@pytest.mark.parametrize("model", ["quick", "quick_pair", "busy"])
def test_quick_batches_run_in_the_event_loop_once_timed(inline_mesh: Mesh, model: str) -> None:
    names = threads_used(inline_mesh, model, 5)
    # The first batch is untimed, so it goes to a thread; the rest took little enough. One
    # instance: a batch that computes for ms but blocks no longer than inline_block_us too.
    assert names[0].startswith("instance"), names
    assert names[1:] == ["MainThread"] * 4, names


@pytest.mark.parametrize("model", ["slow", "busy_pair"])
def test_slow_batches_stay_in_a_thread(inline_mesh: Mesh, model: str) -> None:
    names = threads_used(inline_mesh, model, 4)
    assert all(name.startswith("instance") for name in names), names
