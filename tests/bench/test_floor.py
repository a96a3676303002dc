"""The gateway-floor run (bench/floor.py), end to end: both gateways on one mesh, measured.

It starts the embedded mesh and the floor gateway (bench/floor_gateway.py) on the mesh's
Redis, loads each through bench/http_load.py, and reads their CPU per request: both answer
every request (the floor through the real batcher and worker), and the table and the JSON
agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [
    "--concurrency", "4", "--duration-s", "1", "--warmup-s", "0.5", "--rounds", "1",
    "--load", "python", "--load-processes", "1",
]  # fmt: skip


@pytest.mark.timeout(240)
def test_the_floor_and_the_gateway_both_serve_the_mesh_and_are_compared(
    example_repository: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "bench.floor", "--out", str(out),
         "--repository", str(example_repository), *COMMAND],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    runs = json.loads((out / "floor.json").read_text())["runs"]
    assert [(r["gateway"], r["round"]) for r in runs] == [("weir", 1), ("floor", 1)]
    for r in runs:
        assert r["requests_per_s"] > 0 and r["failures"] == 0, r
        assert r["gateway_us"] > 0, r
        # The requests went through the mesh's batcher and worker, whichever gateway took them.
        assert {"batcher", "worker", "redis"} <= r["mesh_us"].keys(), r

    table = (out / "floor.md").read_text()
    weir, floor = (r["gateway_us"] for r in runs)
    assert f"Weir's gateway {weir:.0f} µs, the floor {floor:.0f} µs" in table, table
    assert (out / "floor-logs" / "floor.log").exists()
