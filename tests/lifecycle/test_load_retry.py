"""A load asked again retries what failed: a model whose first load failed for a passing
reason (here, a resource its initialize needs) loads when asked again, unchanged.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import private_mesh
from tests.lifecycle.helpers import write_config

FLAKY = """
import os
import numpy as np

class Flaky:
    def initialize(self, context):
        if os.path.exists(context.parameters["blocker"]):
            raise RuntimeError("the license server is unreachable")

    def inference(self, batch):
        return {"Y": batch["X"] + 1}
"""


@pytest.mark.timeout(120)
def test_loading_an_unchanged_model_again_retries_a_failed_load(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.touch()
    models = tmp_path / "models"
    write_config(
        models / "flaky",
        {
            "name": "flaky",
            "backend": "python",
            "max_batch_size": 4,
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
            "parameters": {"blocker": {"string_value": str(blocker)}},
        },
    )
    (models / "flaky" / "1").mkdir()
    (models / "flaky" / "1" / "model.py").write_text(FLAKY)
    with private_mesh(models, {"WEIR_MODEL_CONTROL_MODE": "explicit"}) as mesh:
        load = f"{mesh.url}/v2/repository/models/flaky/load"
        failed = httpx.post(load, timeout=60)
        assert failed.status_code == 400
        assert "the license server is unreachable" in failed.json()["error"]
        again = httpx.post(load, timeout=60)
        assert again.status_code == 400  # nothing changed: it fails again, tried again
        blocker.unlink()
        loaded = httpx.post(load, timeout=60)
        assert loaded.status_code == 200, loaded.text
        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
        answer = httpx.post(f"{mesh.url}/v2/models/flaky/infer", json=body, timeout=30)
        assert answer.json()["outputs"][0]["data"] == [2]
