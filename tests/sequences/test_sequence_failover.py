"""A sequence outlives the batcher and the worker that served it: its state is in Redis.

Triton keeps a sequence's state in the instance that runs it, so a crash ends the sequence.
Here the batcher and the worker are killed with SIGKILL between two requests of a sequence;
a fresh batcher takes the model's lease and knows the sequence is open, a fresh worker reads
its state, and the sum goes on.
"""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.chaos.helpers import Topology
from tests.sequences.models import write_repository
from weir.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(180)


def add(url: str, value: int, start: bool = False) -> int:
    body = {
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
        "parameters": {"sequence_id": 8, "sequence_start": start},
    }
    response = httpx.post(f"{url}/v2/models/py_acc/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return int(response.json()["outputs"][0]["data"][0])


def test_a_sequence_goes_on_after_its_batcher_and_worker_die(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models", idle_us=60_000_000)
    port = free_port()
    with RedisServer() as server:
        mesh = Topology(server.url, repository, tmp_path, {"WEIR_HEARTBEAT_TTL_S": "1"})
        try:
            url = mesh.start_mesh(port)
            assert add(url, 5, start=True) == 5
            assert add(url, 6) == 11
            for name in ("batcher", "worker"):
                mesh.by_name[name].send_signal(signal.SIGKILL)
                mesh.by_name[name].wait()
            mesh.start("batcher", "batcher-2")
            mesh.start("worker", "worker-2")
            assert add(url, 7) == 18
            assert add(url, 1) == 19
        finally:
            mesh.stop_all()
        assert "batching the sequences of py_acc:1" in mesh.log("batcher-2")
