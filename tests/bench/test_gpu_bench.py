"""The benchmark's GPU section, end to end on the CPU (``--cpu``): its plumbing, not its speed.

bench/gpu.py runs as the device check runs it, in a subprocess, with ``--cpu``: bert_mini on the
CPU pool, a short point at each of two concurrencies, one gateway process and one load process.
Only the GPU machine measures anything worth reading; this proves that a run builds its
repository, measures a raw limit, starts and stops the mesh, drives load through
bench/http_load.py and writes a table and a JSON document that agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [
    "--models", "bert_mini", "--runtimes", "torch,tensorrt", "--cpu", "--concurrency", "1,4",
    "--duration-s", "0.5", "--warmup-s", "0.2", "--raw-min-s", "0.2", "--raw-batches", "1",
    "--gateways", "1", "--load-processes", "1",
]  # fmt: skip
COLUMNS = ["model", "runtime", "concurrency", "req/s", "p50 ms", "p99 ms", "failed"]


def table_rows(markdown: str) -> list[dict[str, str]]:
    """The table's data rows, by column name (the first columns, which name the point)."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]
    return [dict(zip(COLUMNS, cells, strict=False)) for cells in rows if cells[0] != "---"]


@pytest.mark.timeout(300)
def test_a_cpu_run_serves_bert_mini_through_torch_at_every_concurrency_without_failures(
    example_repository: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--out", str(out), *COMMAND],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]

    torch_rows = [r for r in table_rows((out / "gpu.md").read_text()) if r["runtime"] == "torch"]
    assert [(r["model"], r["concurrency"]) for r in torch_rows] == [
        ("bert_mini", "1"),
        ("bert_mini", "4"),
    ]
    assert all(float(r["req/s"]) > 0 and r["failed"] == "0" for r in torch_rows), torch_rows

    document = json.loads((out / "gpu.json").read_text())
    points = [p for p in document["points"] if p["runtime"] == "torch"]
    assert [p["concurrency"] for p in points] == [1, 4]
    assert all(p["requests"] > 0 and p["failures"] == 0 for p in points), points
    assert document["raw"]["torch"]["bert_mini"]["rows_per_s"] > 0
    assert "tensorrt" in document["skipped"]  # a CPU run names what it could not run
    assert document["failed"] == {}
