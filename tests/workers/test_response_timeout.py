"""A model's ``response_timeout_s``: a batch that runs past it is answered, its worker ends.

A Python model whose handler sleeps as long as its input says, with a 1 s response timeout,
served by a mesh of its own. A batch under the timeout is answered as usual; one past it is
dead-lettered (each request a 500 naming the timeout) and the worker exits with status 75 for
its supervisor to replace it (tests/torchserve/test_response_timeout.py has ``weir up`` do so).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.conftest import private_mesh
from tests.sleeper import write_sleeper
from workers.stall import EXIT_STUCK

HANDLER = """
import time


class Sleeps:
    def initialize(self, context):
        pass

    def inference(self, batch):
        time.sleep(float(batch["X"].reshape(-1)[0]))
        return {"Y": batch["X"]}
"""


def test_a_batch_past_the_response_timeout_is_answered_and_its_worker_exits(
    tmp_path: Path,
) -> None:
    timeout = {"response_timeout_s": {"string_value": "1"}}
    write_sleeper(tmp_path / "models", HANDLER, parameters=timeout)
    url_of = "{}/v2/models/sleeper/infer"

    def infer(url: str, seconds: float) -> httpx.Response:
        tensor = {"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [seconds]}
        return httpx.post(url_of.format(url), json={"inputs": [tensor]}, timeout=30)

    with private_mesh(tmp_path / "models") as mesh:
        assert infer(mesh.url, 0.2).status_code == 200  # under the timeout: served
        started = time.monotonic()
        late = infer(mesh.url, 20.0)
        assert late.status_code == 500, late.text
        assert "response timeout (1 s)" in late.json()["error"]
        assert time.monotonic() - started < 10  # not the 20 s the handler would take
        assert mesh.processes["worker"].wait(10) == EXIT_STUCK
