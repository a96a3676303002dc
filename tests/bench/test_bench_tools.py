"""The benchmark's arithmetic, parsing and point selection, on made-up numbers (nothing timed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.analysis import Point, fastest, model_ms, p99_bound_ms, peak, ratios, targets
from bench.points import Contender, PointRunner, Schedule, Workload
from bench.run import Servers, workloads
from bench.servers import ServerProcess
from bench.variants import RUNTIMES, Runtime, plan
from bench.workload import request_body
from bench.wrk import MARKER, parse_output

RAW = {
    "wide_mlp": [
        {"batch_size": 1, "batch_ms": 5.0, "samples_per_s": 200.0},
        {"batch_size": 2, "batch_ms": 8.0, "samples_per_s": 250.0},
        {"batch_size": 64, "batch_ms": 32.0, "samples_per_s": 2000.0},
    ]
}


def point(server: str, concurrency: int, req_per_s: float, **kw: Any) -> Point:
    fields: dict[str, Any] = {"p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "mean_batch": 1.0}
    fields.update(kw)
    return Point(server, "wide_mlp", concurrency, req_per_s, requests=100, errors=0, **fields)


def test_parse_output_reads_the_lua_result_line_and_counts_failures() -> None:
    line = (
        '{"requests": 1000, "duration_us": 2000000, "bytes": 5, "errors": {"connect": 0, '
        '"read": 1, "write": 0, "status": 9, "timeout": 0}, "latency_us": {"p50": 150, '
        '"p90": 300, "p99": 900, "mean": 180.5, "max": 2000}}'
    )
    result = parse_output(f"Running 2s test\n{MARKER}{line}\n")
    assert (result.p50_us, result.p90_us, result.p99_us) == (150, 300, 900)
    assert result.errors == 10
    assert result.ok_per_s == pytest.approx(495.0)


def test_parse_output_without_a_result_line_is_an_error() -> None:
    with pytest.raises(ValueError, match="no result line"):
        parse_output("unable to connect to 127.0.0.1:1\n")


def test_model_time_interpolates_between_measured_batch_sizes() -> None:
    assert model_ms(RAW, "wide_mlp", 1) == 5.0
    assert model_ms(RAW, "wide_mlp", 1.5) == pytest.approx(6.5)
    assert model_ms(RAW, "wide_mlp", 33) == pytest.approx(8.0 + 24.0 * 31 / 62)
    assert model_ms(RAW, "wide_mlp", 128) == pytest.approx(64.0)


def test_p99_goal_is_twice_p50_plus_the_model_time_at_the_batch_served() -> None:
    assert p99_bound_ms(point("weir", 8, 100.0, p50_ms=4.0, mean_batch=2.0), RAW) == 16.0


def test_ratios_compare_peaks_with_the_baseline_and_the_raw_limit() -> None:
    points = [point("weir", 1, 300.0), point("weir", 64, 1500.0), point("baseline", 8, 200.0)]
    assert peak(points, "weir", "wide_mlp") == 1500.0
    r = ratios(points, RAW, "wide_mlp")
    assert r["weir_over_baseline"] == pytest.approx(7.5)
    assert r["weir_over_raw_max_batch"] == pytest.approx(0.75)
    assert r["raw_best_batch"] == 64


def test_targets_state_which_goals_were_met() -> None:
    points = [point("weir", 64, 1500.0, p99_ms=100.0), point("baseline", 64, 200.0)]
    met = {t.name: t.met for t in targets(points, RAW, memory_mib=450.0)}
    assert met == {
        "Weir peak / raw at batch 64": True,
        "Weir peak / baseline peak": True,
        "Weir p99 at concurrency 64 (ms)": False,
        "Weir RSS less model weights (MiB)": False,
    }


def test_request_body_follows_the_config_with_a_batch_of_one(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(
        "name: m\ninput:\n  - {name: ids, data_type: TYPE_INT64, dims: [4]}\n"
    )
    body = request_body(tmp_path, "m")
    [tensor] = body["inputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == ("ids", "INT64", [1, 4])
    assert len(tensor["data"]) == 4
    assert body == request_body(tmp_path, "m")


def test_the_raw_limit_keeps_the_faster_of_two_runs_per_batch_size() -> None:
    slower = {"wide_mlp": [{**r, "samples_per_s": r["samples_per_s"] / 2} for r in RAW["wide_mlp"]]}
    mixed = {"wide_mlp": [RAW["wide_mlp"][0], *slower["wide_mlp"][1:]]}
    assert fastest(mixed, slower) == {"wide_mlp": mixed["wide_mlp"]}
    assert fastest(slower, RAW) == RAW


class ScriptedRunner(PointRunner):
    """Answers each measurement from a list of req/s per contender, recording the order."""

    def __init__(self, rates: dict[tuple[str, str], list[float]], rounds: int) -> None:
        servers = {name: ServerProcess(name, [], 0, Path("/dev/null")) for name, _ in rates}
        super().__init__(list(servers.values()), Schedule([8], 0, 1, rounds))
        self.contenders = [Contender(servers[name], runtime) for name, runtime in rates]
        self.rates = rates
        self.order: list[str] = []

    def measure(self, contender: Contender, model: str, concurrency: int, body: Path) -> Point:
        key = (contender.server.name, contender.runtime)
        self.order.append(contender.label(model))
        rate = self.rates[key].pop(0)
        if rate < 0:
            raise RuntimeError("this run failed")
        return point(key[0], concurrency, rate, runtime=key[1])


def test_each_point_keeps_the_best_round_and_rounds_alternate_who_goes_first() -> None:
    rates = {
        ("baseline", "torch"): [100.0, 120.0, 90.0],
        ("weir", "torch"): [300.0, -1.0, 250.0],
        ("weir", "openvino"): [400.0, 410.0, 390.0],
    }
    runner = ScriptedRunner(rates, 3)
    work = Workload("wide_mlp", Path("body.json"), runner.contenders)
    kept = runner._rounds(work, 8)
    assert [(p.server, p.runtime, p.req_per_s) for p in kept] == [
        ("baseline", "torch", 120.0),
        ("weir", "torch", 300.0),
        ("weir", "openvino", 410.0),
    ]
    first = ["baseline wide_mlp", "weir wide_mlp", "weir wide_mlp_openvino"]
    assert runner.order == [*first, *first[::-1], *first]


def test_the_baseline_serves_only_torch_and_only_when_torch_is_measured() -> None:
    weir = ServerProcess("weir", [], 0, Path("/dev/null"))
    baseline = ServerProcess("baseline", [], 0, Path("/dev/null"))
    models = ["tiny_mlp", "bert_mini"]
    bodies = {m: Path(f"{m}.json") for m in models}
    every = plan(models, list(RUNTIMES))
    [tiny, bert] = workloads(models, every, bodies, Servers(weir, baseline))
    assert [c.label("tiny_mlp") for c in tiny.contenders] == ["baseline tiny_mlp", "weir tiny_mlp"]
    assert [(c.server.name, c.runtime) for c in bert.contenders] == [
        ("baseline", "torch"),
        ("weir", "torch"),
        ("weir", "onnxruntime"),
        ("weir", "openvino"),
    ]
    no_torch = plan(models, [Runtime.OPENVINO])
    [tiny, bert] = workloads(models, no_torch, bodies, Servers(weir, None))
    assert tiny.contenders == []
    assert [c.label("bert_mini") for c in bert.contenders] == ["weir bert_mini_openvino"]
