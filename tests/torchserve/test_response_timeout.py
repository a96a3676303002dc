"""TorchServe's ``responseTimeout``: a handler that stops answering is given up on.

``weir up`` serves an archive whose ``model-config.yaml`` sets ``responseTimeout: 2`` and
whose handler hangs on one input. The hung request is answered with a 500 (its batch
dead-lettered) soon after the timeout rather than never, the worker that ran it exits, and
``weir up`` starts a fresh one that serves the next requests.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import redis

from tests.conftest import free_port, wait_until
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up
from weir import names

HANDLER = """
import time


def handle(data, context):
    if data is None:
        return None
    bodies = [bytes(row["body"]).decode() for row in data]
    if "hang" in bodies:
        time.sleep(600)
    return [{"got": body} for body in bodies]
"""
TIMEOUT_S = 2


def answer(port: int, body: bytes) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/predictions/hanger", content=body, timeout=60)


def test_a_handler_past_its_response_timeout_is_answered_and_its_worker_replaced(
    tmp_path: Path,
) -> None:
    store = tmp_path / "model-store"
    build_archive(store, "hanger", HANDLER, config_yaml=f"responseTimeout: {TIMEOUT_S}\n")
    config = write_ts_config(tmp_path, store)
    http_port, management_port = config.http_port, config.management_port
    args = ["--ts-config", str(config.path), "--models", "hanger=hanger.mar", "--grpc-port", "0"]
    redis_port = free_port()
    with weir_up(*args, "--redis-port", str(redis_port)):
        (described,) = httpx.get(f"http://127.0.0.1:{management_port}/models/hanger").json()
        assert described["responseTimeout"] == TIMEOUT_S
        assert answer(http_port, b"hi").json() == {"got": "hi"}

        started = time.monotonic()
        hung = answer(http_port, b"hang")
        assert hung.status_code == 500, hung.text
        # TorchServe's error shape, saying why.
        assert hung.json()["code"] == 500
        assert f"response timeout ({TIMEOUT_S} s)" in hung.json()["message"]
        assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 10

        # The batch is parked on the dead-letter stream, replayable, with its reason.
        with redis.Redis(port=redis_port) as client:
            (dead,) = client.xrange(names.dead_letter_stream("hanger", "1"))
        assert b"response timeout" in dead[1][b"reason"]

        # A fresh worker serves what comes next; the hung one is gone.
        def served() -> bool:
            try:
                return answer(http_port, b"again").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(served, 60, "a fresh worker to serve")
        assert answer(http_port, b"more").json() == {"got": "more"}
