"""CPU per request by process: roles from command lines, the arithmetic, and its tables."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest

from bench.analysis import Point
from bench.cpu import ProcessCpu, per_request_us, role, tree_cpu
from bench.peer_report import (
    by_process,
    cpu_table,
    memory_ratio,
    peer_summary,
    peer_table,
    peer_targets,
)
from bench.report import memory_lines

PY = "/work/.venv/bin/python3"
TS = "/work/bench/results/torchserve-venv"


@pytest.mark.parametrize(
    ("command", "name", "expected"),
    [
        ([PY, "-m", "weir.cli", "up", "--http-port", "1"], "python3", "weir up"),
        ([PY, "-m", "weir.embedded"], "python3", "weir up"),
        ([PY, "-m", "weir.cli", "gateway", "--port", "1"], "python3", "gateway"),
        ([PY, "-m", "weir.cli", "worker", "--pool", "cpu"], "python3", "worker"),
        ([PY, "-m", "weir.cli", "batcher"], "python3", "batcher"),
        (["redis-server 127.0.0.1:6400"], "redis-server", "redis"),
        (["java", "-cp", "x", "org.pytorch.serve.ModelServer", "--python", PY], "java", "frontend"),
        ([PY, f"{TS}/ts/model_service_worker.py", "--sock-type", "unix"], "python3", "worker"),
        ([PY, f"{TS}/bin/torchserve", "--start", "--foreground"], "python3", "launcher"),
        ([PY, "-m", "bench.baseline_app", "--port", "1"], "python3", "baseline"),
        (["sleep", "10"], "sleep", "sleep"),
    ],
)
def test_a_process_role_comes_from_its_command_line(
    command: list[str], name: str, expected: str
) -> None:
    assert role(command, name) == expected


def test_cpu_per_request_is_each_roles_cpu_delta_over_answered_requests() -> None:
    before = {1: ProcessCpu("gateway", 10.0), 2: ProcessCpu("redis", 1.0)}
    after = {1: ProcessCpu("gateway", 10.5), 2: ProcessCpu("redis", 1.1)}
    assert per_request_us(before, after, 1000) == pytest.approx({"gateway": 500.0, "redis": 100.0})


def test_workers_of_one_role_add_up_and_a_new_process_counts_from_zero() -> None:
    before = {7: ProcessCpu("frontend", 3.0), 8: ProcessCpu("worker", 2.0)}
    after = {
        7: ProcessCpu("frontend", 3.2),
        8: ProcessCpu("worker", 2.1),
        9: ProcessCpu("worker", 0.3),  # started during the window
    }
    found = per_request_us(before, after, 2000)
    assert found == pytest.approx({"frontend": 100.0, "worker (2)": 200.0})


def test_a_reused_pid_with_another_role_counts_from_zero_and_no_answers_gives_nothing() -> None:
    before = {5: ProcessCpu("batcher", 9.0)}
    after = {5: ProcessCpu("worker", 0.01)}
    assert per_request_us(before, after, 100) == pytest.approx({"worker": 100.0})
    assert per_request_us(before, after, 0) == {}


def test_tree_cpu_reads_this_process() -> None:
    [(pid, sample)] = [(p, s) for p, s in tree_cpu(os.getpid()).items() if p == os.getpid()]
    assert pid == os.getpid()
    assert sample.cpu_s > 0


def point(server: str, concurrency: int, req_per_s: float, cpu: dict[str, float]) -> Point:
    return Point(
        server,
        "tiny_mlp",
        concurrency,
        req_per_s,
        p50_ms=1.0,
        p90_ms=2.0,
        p99_ms=3.0,
        mean_batch=0.0 if server == "torchserve" else 1.0,
        requests=100,
        errors=0,
        cpu_us_per_request=cpu,
    )


POINTS = [
    point("weir", 1, 800.0, {"gateway": 600.0, "worker": 700.0, "weir up": 0.4}),
    point("weir", 64, 6000.0, {"gateway": 125.0, "worker": 47.0, "redis": 25.0}),
    point("torchserve", 1, 200.0, {"frontend": 2000.0, "worker": 600.0}),
    point("torchserve", 64, 4000.0, {"frontend": 200.0, "worker": 60.0}),
]


def test_the_peer_table_sets_weir_beside_torchserve_with_the_ratio() -> None:
    assert peer_summary(POINTS, "tiny_mlp")["weir_over_torchserve"] == pytest.approx(1.5)
    table = peer_table(POINTS, ["tiny_mlp"])
    assert table[2].startswith(
        "| tiny_mlp | 1 | 800 | 200 | 4.00x | 1.00 / 3.00 | 1.00 / 3.00 | 1300 |"
    )
    assert "| tiny_mlp | 64 | 6000 | 4000 | 1.50x |" in table[3]
    assert "**1.50x**" in table[4]
    assert peer_table([p for p in POINTS if p.server == "weir"], ["tiny_mlp"]) == []


def test_weir_serving_the_archives_pairs_with_torchserve_in_its_own_table() -> None:
    archives = [
        point("weir-archives", 1, 500.0, {"gateway": 900.0, "worker": 800.0}),
        point("weir-archives", 64, 2000.0, {"gateway": 120.0, "worker": 80.0}),
    ]
    assert peer_summary(POINTS + archives, "tiny_mlp", "weir-archives")[
        "weir_over_torchserve"
    ] == pytest.approx(0.5)
    table = peer_table(POINTS + archives, ["tiny_mlp"], "weir-archives")
    assert "| tiny_mlp | 1 | 500 | 200 | 2.50x |" in table[2]
    assert "**0.50x**" in table[4]
    assert peer_table(POINTS, ["tiny_mlp"], "weir-archives") == []  # it did not run
    assert peer_table(POINTS + archives, ["tiny_mlp"]) == peer_table(POINTS, ["tiny_mlp"])


def test_the_cpu_table_lists_each_server_with_its_processes_largest_first() -> None:
    assert by_process({"redis": 25.0, "gateway": 125.0, "worker": 47.0}) == (
        "gateway 125, worker 47, redis 25"
    )
    rows = cpu_table(POINTS)[2:]
    assert [r.split(" | ")[1:3] for r in rows] == [
        ["1", "torchserve"],
        ["1", "weir"],
        ["64", "torchserve"],
        ["64", "weir"],
    ]
    assert rows[3].endswith("| 197 | gateway 125, worker 47, redis 25 |")


def _memory(weir_mib: float, runtimes: list[str], torchserve_mib: float | None) -> dict[str, Any]:
    memory: dict[str, Any] = {
        "runtimes": runtimes,
        "peak_total_mib": weir_mib,
        "weights_mib": 10.0,
        "peak_minus_weights_mib": weir_mib - 10.0,
        "processes": [{"label": "weir gateway", "rss_mib": weir_mib}],
        "peers": {},
        "models": ["tiny_mlp"],
    }
    if torchserve_mib is not None:
        processes = [{"label": "frontend", "rss_mib": torchserve_mib}]
        memory["peers"]["torchserve"] = {"peak_total_mib": torchserve_mib, "processes": processes}
    return memory


def test_the_goals_against_torchserve_are_read_from_the_points_and_the_memory() -> None:
    slow_at_one = dataclasses.replace(POINTS[0], p50_ms=0.2)  # TorchServe's p50 is 1.0
    points = [slow_at_one, *POINTS[1:]]
    found = {t.name: t for t in peer_targets(points, _memory(600.0, ["torch"], 1000.0))}
    assert found["Weir / TorchServe req/s at concurrency 64"].measured == pytest.approx(1.5)
    assert found["Weir / TorchServe req/s at concurrency 64"].met
    assert found["Weir all processes CPU µs/req at concurrency 64"].measured == 197.0
    assert found["Weir all processes CPU µs/req at concurrency 64"].met
    assert found["Weir gateway CPU µs/req at concurrency 64"].measured == 125.0
    assert not found["Weir gateway CPU µs/req at concurrency 64"].met
    assert found["Weir p50 / TorchServe p50 at concurrency 1"].measured == pytest.approx(0.2)
    assert found["Weir p50 / TorchServe p50 at concurrency 1"].met
    assert found["Weir RSS / TorchServe RSS"].measured == pytest.approx(0.6)
    assert found["Weir RSS / TorchServe RSS"].met
    assert found["Weir RSS / TorchServe RSS"].model == "tiny_mlp"
    assert len(found) == 5  # wide_mlp and bert_mini were not measured


def test_memory_compares_with_torchserve_only_when_both_served_torch_alone() -> None:
    assert memory_ratio(_memory(900.0, ["torch"], 1000.0)) == pytest.approx(0.9)
    assert memory_ratio(_memory(900.0, ["torch", "onnxruntime"], 1000.0)) is None
    assert memory_ratio(_memory(900.0, ["torch"], None)) is None
    found = peer_targets([p for p in POINTS if p.server == "weir"], _memory(900.0, ["torch"], None))
    assert [t.name for t in found] == [
        "Weir all processes CPU µs/req at concurrency 64",
        "Weir gateway CPU µs/req at concurrency 64",
    ]


def test_the_memory_lines_set_torchserve_beside_weir() -> None:
    lines = memory_lines(_memory(900.0, ["torch"], 1000.0))
    assert lines[-1] == (
        "torchserve's processes at their peak: 1000 MiB in all (frontend 1000). "
        "Weir / TorchServe: **0.90**."
    )
    mixed = memory_lines(_memory(900.0, ["torch", "openvino"], 1000.0))
    assert mixed[-1].endswith("Weir served other runtimes too: the totals do not compare.")
    assert len(memory_lines(_memory(900.0, ["torch"], None))) == 1
