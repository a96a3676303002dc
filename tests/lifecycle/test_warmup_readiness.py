"""Warm-up gates readiness: a model is not ready, and gets no request, until it is warm.

``slow``'s first call takes seconds (a cache it fills, say); its ``model_warmup`` pays that
before the model is served, so a load answers only once it is warm, the model reports not
ready meanwhile, and the first request is answered at once. A model whose warm-up fails is
UNAVAILABLE with the reason, and the load says why.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import private_mesh
from tests.lifecycle.helpers import write_config

FIRST_CALL_S = 3.0

SLOW = f"""
import time
import numpy as np

class Slow:
    def initialize(self, context):
        self.warm = False

    def inference(self, batch):
        if not self.warm:
            time.sleep({FIRST_CALL_S})  # the first call fills a cache
            self.warm = True
        if (batch["X"] < 0).any():
            raise ValueError("negative input in the warm-up")
        return {{"Y": batch["X"] * 2}}
"""


def slow_config(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
        "model_warmup": [
            {
                "name": "fill the cache",
                "batch_size": 1,
                "inputs": {"X": {"data_type": "TYPE_FP32", "dims": [2], "zero_data": True}},
            }
        ],
    }


def write_model(root: Path, name: str, config: dict[str, Any]) -> None:
    write_config(root / name, config)
    (root / name / "1").mkdir()
    (root / name / "1" / "model.py").write_text(SLOW)


@pytest.mark.timeout(120)
def test_a_model_is_ready_only_once_warm_and_a_failed_warm_up_says_why(tmp_path: Path) -> None:
    write_model(tmp_path, "slow", slow_config("slow"))
    broken = slow_config("cold")
    broken["model_warmup"][0]["inputs"]["X"] = {
        "data_type": "TYPE_FP32",
        "dims": [2],
        "input_data_file": "negative.bin",
    }
    write_model(tmp_path, "cold", broken)
    (tmp_path / "cold" / "warmup").mkdir()
    (tmp_path / "cold" / "warmup" / "negative.bin").write_bytes(b"\x00\x00\x80\xbf" * 2)

    env = {"WEIR_MODEL_CONTROL_MODE": "explicit"}
    with private_mesh(tmp_path, env) as mesh:
        answers: list[httpx.Response] = []
        loading = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"{mesh.url}/v2/repository/models/slow/load", timeout=60)
            )
        )
        started = time.monotonic()
        loading.start()
        readiness: list[tuple[float, int]] = []  # (seconds since the load, status)
        while loading.is_alive():
            ready = httpx.get(f"{mesh.url}/v2/models/slow/ready", timeout=5)
            readiness.append((time.monotonic() - started, ready.status_code))
            time.sleep(0.2)
        loading.join()
        assert answers[0].status_code == 200, answers[0].text
        assert time.monotonic() - started >= FIRST_CALL_S
        assert any(status == 503 for _, status in readiness)
        assert all(s >= FIRST_CALL_S for s, status in readiness if status == 200), readiness
        assert httpx.get(f"{mesh.url}/v2/models/slow/ready").status_code == 200

        body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        sent = time.monotonic()
        response = httpx.post(f"{mesh.url}/v2/models/slow/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert time.monotonic() - sent < FIRST_CALL_S / 2
        assert response.json()["outputs"][0]["data"] == [2, 4]

        failed = httpx.post(f"{mesh.url}/v2/repository/models/cold/load", timeout=60)
        assert failed.status_code == 400
        assert "warm-up 'fill the cache' failed" in failed.json()["error"]
        assert "negative input in the warm-up" in failed.json()["error"]
        index = httpx.post(f"{mesh.url}/v2/repository/index").json()
        (cold,) = [m for m in index if m["name"] == "cold"]
        assert cold["state"] == "UNAVAILABLE"
        assert "negative input in the warm-up" in cold["reason"]
