"""The gateway-scaling run (bench/scaling.py), end to end on this machine: its plumbing.

Its numbers mean something only on a machine with cores to spare (the 16-core GPU machine's
device check runs it with 1, 2, 4 and 8 gateway processes); here two short points prove that
each starts a mesh of the asked size, loads it through bench/http_load.py, reads every
process's CPU and the model's batches, stops it, and writes a table and a JSON document
that agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.scaling import TIMES, Point, best_points

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [
    "--gateways", "1,2", "--batchers", "2", "--concurrency-per-gateway", "4",
    "--duration-s", "1", "--warmup-s", "0.5", "--load", "python", "--load-processes", "1",
]  # fmt: skip


@pytest.mark.timeout(240)
def test_each_gateway_count_gets_its_own_mesh_and_every_point_is_answered(
    example_repository: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "bench.scaling", "--out", str(out),
         "--repository", str(example_repository), *COMMAND],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    points = json.loads((out / "scaling.json").read_text())["points"]
    assert [(p["gateways"], p["connections"], p["batchers"]) for p in points] == [
        (1, 4, 2),
        (2, 8, 2),
    ]
    assert all(p["requests_per_s"] > 0 and p["failures"] == 0 and not p["error"] for p in points)
    assert all(p["mean_batch"] >= 1 for p in points), points
    one, two = (p["cpu_us"] for p in points)
    # Every process of the mesh is counted: two gateways run under their launcher.
    assert {"gateway", "batcher (2)", "worker", "redis"} <= one.keys(), one
    assert {"gateway (3)", "batcher (2)", "worker", "redis"} <= two.keys(), two

    table = (out / "scaling.md").read_text()
    rows = [line for line in table.splitlines() if line[:4] in ("| 1 ", "| 2 ")]
    assert len(rows) == 2 and rows[0].split("|")[6].strip() == f"1.00{TIMES}", table
    assert f"1 → 8 gateway processes ≥ 5{TIMES}: not measured in this run" in table
    assert (out / "scaling-logs" / "gateways-2.log").stat().st_size > 0


def test_each_gateway_count_reports_its_best_round() -> None:
    def point(gateways: int, round_: int, rate: float, error: str = "") -> Point:
        return Point(gateways, 1, 1, 64 * gateways, requests_per_s=rate, error=error, round=round_)

    every = [
        point(1, 1, 5000), point(2, 1, 0, "RuntimeError: not ready"),
        point(2, 2, 9000), point(1, 2, 5600),
        point(4, 1, 0, "RuntimeError: a"), point(4, 2, 0, "RuntimeError: b"),
    ]  # fmt: skip
    best = best_points(every, [1, 2, 4])
    assert [(p.gateways, p.round, p.requests_per_s) for p in best] == [
        (1, 2, 5600),
        (2, 2, 9000),  # an answered round before a failed one, whatever its rate
        (4, 1, 0),  # every round failed: the report names the failure
    ]
    assert best[2].error
