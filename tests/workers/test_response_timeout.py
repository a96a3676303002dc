"""A model's ``response_timeout_s``: a batch that runs past it is answered, its worker ends.

A Python model whose handler sleeps as long as its input says, with a 1 s response timeout,
served by a mesh of its own. A batch under the timeout is answered as usual; one past it is
dead-lettered (each request a 500 naming the timeout) and the worker exits with status 3 for
its supervisor to replace it (tests/torchserve/test_response_timeout.py has ``weir up`` do so).
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import httpx
import yaml

from tests.conftest import private_mesh
from workers.lane import EXIT_STUCK

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
    version = tmp_path / "models" / "sleeper" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(HANDLER))
    config = {
        "name": "sleeper",
        "backend": "python",
        "max_batch_size": 1,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        "parameters": {"response_timeout_s": {"string_value": "1"}},
    }
    (version.parent / "config.yaml").write_text(yaml.safe_dump(config))
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
