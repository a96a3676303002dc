"""The stall limit: a handler that hangs in the worker's event loop does not hold it for good.

``weir up`` serves a quick one-instance Python model, whose batches therefore run in the
worker's event loop, and whose handler never returns on one input. While that batch hangs,
the worker stays registered (nobody claims the batch and hangs on it in turn); past
``WEIR_WORKER_INLINE_STALL_S`` the request is answered with a 500 that names the limit, the
batch is dead-lettered, the worker exits, and a fresh one serves the next requests.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import free_port, wait_until
from tests.sleeper import write_sleeper
from tests.weir_up import weir_up
from weir import names

HANDLER = """
import threading


class HangsOnBigInputs:
    def initialize(self, context):
        self.never = threading.Event()

    def inference(self, batch):
        if float(batch["X"].reshape(-1)[0]) > 100:
            self.never.wait()  # a lock never released, say
        return {"Y": batch["X"]}
"""
STALL_S = 3
TTL_S = 1


def infer(port: int, value: float) -> httpx.Response:
    tensor = {"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [value]}
    url = f"http://127.0.0.1:{port}/v2/models/sleeper/infer"
    return httpx.post(url, json={"inputs": [tensor]}, timeout=60)


def live_workers(client: redis.Redis) -> list[bytes]:
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    expiry = names.live_expiry(names.WORKER_GROUP)
    return list(client.zrangebyscore(expiry, f"({now_ms}", "+inf"))


def test_a_batch_that_hangs_in_the_event_loop_is_answered_and_its_worker_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_sleeper(tmp_path / "models", HANDLER)
    monkeypatch.setenv("WEIR_WORKER_INLINE_STALL_S", str(STALL_S))
    monkeypatch.setenv("WEIR_HEARTBEAT_TTL_S", str(TTL_S))
    http_port, redis_port = free_port(), free_port()
    args = ["--repository", str(tmp_path / "models"), "--http-port", str(http_port)]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(redis_port)]
    with weir_up(*args), redis.Redis(port=redis_port) as client:
        for value in range(5):  # timed quick: the lane's next batches run in the event loop
            assert infer(http_port, value).json()["outputs"][0]["data"] == [value]
        (worker,) = live_workers(client)

        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            hung = pool.submit(infer, http_port, 500.0)

            def answered_while_registered() -> bool:
                # Registered all along, though the loop that beats is held past its TTL.
                assert live_workers(client) == [worker]
                return hung.done()

            wait_until(answered_while_registered, STALL_S + 10, "the hung request's answer")
            answer = hung.result()
        assert answer.status_code == 500, answer.text
        assert "WEIR_WORKER_INLINE_STALL_S" in answer.json()["error"]
        assert STALL_S <= time.monotonic() - started < STALL_S + 10

        (dead,) = client.xrange(names.dead_letter_stream("sleeper", "1"))
        assert b"stall limit" in dead[1][b"reason"]

        def served() -> bool:
            try:
                return infer(http_port, 7.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(served, 60, "a fresh worker to serve")
        assert worker not in live_workers(client)
