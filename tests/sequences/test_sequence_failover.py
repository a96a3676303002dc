"""A sequence outlives the batcher and the worker that served it: its state is in Redis.

Triton keeps a sequence's state in the instance that runs it, so a crash ends the sequence.
Here the batcher and the worker are killed with SIGKILL between two requests of a sequence;
a fresh batcher takes the model's lease and knows the sequence is open, a fresh worker reads
its state, and the sum goes on.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from tests.chaos.helpers import Topology
from tests.conftest import http_ready, wait_until
from tests.sequences.models import write_repository
from weir import names
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


def test_a_request_whose_worker_dies_holding_it_moves_the_state_on_once(tmp_path: Path) -> None:
    """Killed holding the batch of a sequence's request (delivered to it, not acked): its
    state is unwritten, since it goes with the batch's ack, so the worker that claims the
    batch runs it from the state before it, and the sum counts the request once."""
    repository = write_repository(tmp_path / "models", idle_us=60_000_000)
    port = free_port()
    batches = names.batch_stream("py_acc", "1")
    with RedisServer() as server:
        env = {
            "WEIR_HEARTBEAT_TTL_S": "1",
            "WEIR_WORKER_RECLAIM_IDLE_MS": "200",
            "WEIR_WORKER_RECLAIM_INTERVAL_S": "0.2",
        }
        mesh = Topology(server.url, repository, tmp_path, env)
        client = redis.Redis.from_url(server.url)
        try:
            mesh.start("batcher", "batcher")
            # A long block: the read it is stopped in must not time out before the batch comes.
            victim = mesh.start(
                "worker", "worker-a", WEIR_WORKER_NAME="a", WEIR_WORKER_BLOCK_MS="30000"
            )
            mesh.start("gateway", "gateway", WEIR_GATEWAY_HTTP_PORT=str(port))
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: http_ready(f"{url}/v2/health/ready"), 60, "the mesh")
            assert add(url, 5, start=True) == 5
            # Stopped while blocked in its read of batches, Redis still delivers the next batch
            # to it; stopped anywhere else (acking the last one), it would never hold one.
            wait_until(lambda: blocked_reading(client, victim.pid), 20, "the worker's read")
            victim.send_signal(signal.SIGSTOP)
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(add, url, 6)
                wait_until(lambda: pending(client, batches, "cpu-a") > 0, 20, "a held batch")
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                mesh.start("worker", "worker-b", WEIR_WORKER_NAME="b")
                assert answer.result(timeout=60) == 11
            assert add(url, 7) == 18
        finally:
            client.close()
            mesh.stop_all()
        assert "from dead workers" in mesh.log("worker-b")


def blocked_reading(client: redis.Redis, pid: int) -> bool:
    """Whether a connection of process ``pid`` is blocked in an ``XREADGROUP``."""
    ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.laddr}
    for entry in client.client_list():
        port = int(str(entry["addr"]).rsplit(":", 1)[1])
        if port in ports and entry["cmd"] == "xreadgroup" and "b" in entry["flags"]:
            return True
    return False


def pending(client: redis.Redis, stream: str, consumer: str) -> int:
    summary = client.xpending(stream, "workers")
    owners = {c["name"].decode(): int(c["pending"]) for c in summary["consumers"] or []}
    return owners.get(consumer, 0)


def test_unloading_a_sequence_model_ends_its_sequences(tmp_path: Path) -> None:
    repository = write_repository(tmp_path / "models", idle_us=60_000_000)
    port = free_port()
    env = {
        "WEIR_MODEL_CONTROL_MODE": "explicit",
        "WEIR_LOAD_MODEL": "py_acc",
        "WEIR_RETIRE_TIMEOUT_S": "2",
    }
    with RedisServer() as server:
        mesh = Topology(server.url, repository, tmp_path, env)
        client = redis.Redis.from_url(server.url)
        states = names.sequence_states("py_acc", "1")
        try:
            url = mesh.start_mesh(port)
            assert add(url, 5, start=True) == 5
            assert client.hkeys(states) == [b"8"]
            unloaded = httpx.post(f"{url}/v2/repository/models/py_acc/unload", timeout=60)
            assert unloaded.status_code == 200, unloaded.text
            wait_until(lambda: not client.exists(states), 30, "the sequences to end")
        finally:
            client.close()
            mesh.stop_all()
