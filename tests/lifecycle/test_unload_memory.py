"""Unloading a model gives its memory back: the worker's resident size returns to what it
was before the load (within 15 %), after the model served requests.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import EXAMPLES, private_mesh, wait_until


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def infer_wide(url: str, rows: int) -> None:
    x = np.random.default_rng(0).standard_normal((rows, 1024), dtype=np.float32)
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 1024], "data": x.tolist()}
    body = {"inputs": [tensor]}
    response = httpx.post(f"{url}/v2/models/wide_mlp/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text


@pytest.mark.timeout(180)
def test_unloading_a_model_returns_the_worker_to_its_size_before_the_load(
    tmp_path: Path, example_repository: Path
) -> None:
    for model in ("tiny_mlp", "wide_mlp"):
        shutil.copytree(EXAMPLES / model, tmp_path / model)
    env = {"WEIR_MODEL_CONTROL_MODE": "explicit", "WEIR_LOAD_MODEL": "tiny_mlp"}
    with private_mesh(tmp_path, env) as mesh:
        worker = mesh.processes["worker"].pid
        before = resident_bytes(worker)
        response = httpx.post(f"{mesh.url}/v2/repository/models/wide_mlp/load", timeout=120)
        assert response.status_code == 200, response.text
        for rows in (1, 8, 32):
            infer_wide(mesh.url, rows)
        loaded = resident_bytes(worker)
        assert loaded > before + 80 * 1024 * 1024, (before, loaded)  # its 96 MB of weights
        response = httpx.post(f"{mesh.url}/v2/repository/models/wide_mlp/unload", timeout=120)
        assert response.status_code == 200, response.text
        wait_until(
            lambda: resident_bytes(worker) <= before * 1.15,
            20,
            f"the worker's memory to come back (before {before >> 20} MiB, loaded "
            f"{loaded >> 20} MiB, now {resident_bytes(worker) >> 20} MiB)",
        )
