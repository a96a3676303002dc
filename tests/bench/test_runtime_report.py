"""The runtime-by-runtime report, rendered from fixed numbers (nothing measured)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.analysis import Point, p99_bound_ms, runtime_summary, targets


def curve(*rates: tuple[int, float]) -> list[dict[str, float]]:
    return [
        {"batch_size": b, "batch_ms": b / rate * 1e3, "samples_per_s": rate} for b, rate in rates
    ]


RAW = {
    "wide_mlp": curve((1, 200.0), (8, 800.0), (64, 2000.0)),
    "wide_mlp_onnx": curve((1, 300.0), (8, 2500.0), (64, 2400.0)),
    "wide_mlp_openvino": curve((1, 250.0), (8, 1000.0), (64, 1800.0)),
}


def point(server: str, runtime: str, concurrency: int, req_per_s: float, **kw: Any) -> Point:
    fields: dict[str, Any] = {"p50_ms": 10.0, "p90_ms": 12.0, "p99_ms": 15.0, "mean_batch": 8.0}
    fields.update(kw)
    return Point(
        server,
        "wide_mlp",
        concurrency,
        req_per_s,
        requests=1000,
        errors=0,
        runtime=runtime,
        **fields,
    )


POINTS = [
    point("baseline", "torch", 8, 180.0, mean_batch=1.0),
    point("baseline", "torch", 64, 170.0, mean_batch=1.0),
    point("weir", "torch", 8, 700.0),
    point("weir", "torch", 64, 1100.0),
    point("weir", "onnxruntime", 8, 900.0),
    point("weir", "onnxruntime", 64, 1500.0),
    point("weir", "openvino", 8, 950.0),
    point("weir", "openvino", 64, 940.0),
]


def record(points: list[Point], raw: dict[str, Any]) -> dict[str, Any]:
    memory = {"peak_total_mib": 900.0, "weights_mib": 300.0, "peak_minus_weights_mib": 600.0}
    memory["processes"] = [{"label": "weir worker cpu", "rss_mib": 700.0}]
    return {
        "date": "2026-12-01T00:00:00Z",
        "machine": {"summary": "2 cores (test), 24 GiB, Linux"},
        "settings": {"duration_s": 4, "warmup_s": 2, "rounds": 1},
        "raw": {"torch_threads": 2, "threads": 2, "models": raw},
        "points": [asdict(p) for p in points],
        "memory": memory,
    }


def test_a_runtimes_row_is_its_raw_best_beside_weirs_peak_through_it() -> None:
    row = runtime_summary(POINTS, RAW, "wide_mlp", "onnxruntime")
    assert (row["raw_best"], row["raw_best_batch"]) == (2500.0, 8)
    assert (row["weir_peak"], row["weir_peak_concurrency"]) == (1500.0, 64)
    assert row["weir_over_raw_best"] == pytest.approx(0.6)
    torch_row = runtime_summary(POINTS, RAW, "wide_mlp", "torch")
    assert torch_row["weir_peak"] == 1100.0  # the baseline's points are not Weir's


def test_the_runtime_table_has_one_row_per_runtime_and_marks_the_fastest() -> None:
    served = [("wide_mlp", "torch"), ("wide_mlp", "onnxruntime"), ("wide_mlp", "openvino")]
    lines = report.runtime_table(POINTS, RAW, served)
    assert lines[0].startswith("| model | runtime | raw best samples/s (batch) |")
    assert lines[2:] == [
        "| wide_mlp | torch | 2000 (64) | 1100 (64) | 55% |",
        "| wide_mlp | onnxruntime | **2500 (8)** | **1500 (64)** | 60% |",
        "| wide_mlp | openvino | 1800 (64) | 950 (8) | 53% |",
    ]


def test_the_report_shows_every_runtime_and_keeps_the_torch_tables() -> None:
    text = report.markdown(record(POINTS, RAW), POINTS, [])
    assert "torch threads 2, ONNX Runtime's and OpenVINO's 2" in text
    assert "| wide_mlp | onnxruntime | 300 (3.33 ms) | 2500 (3.20 ms) | 2400 (26.67 ms) |" in text
    assert "| wide_mlp | onnxruntime | **2500 (8)** | **1500 (64)** | 60% |" in text
    # The Weir-against-baseline table stays torch's: 1100 req/s, not OpenVINO's or ORT's.
    assert "| wide_mlp | 1100 | 180 | 2000 (64) | 2000 | 6.11x | 55% | 55% |" in text
    assert "| wide_mlp | weir | openvino | 8 | 950 |" in text
    assert "| wide_mlp | baseline | torch | 64 | 170 |" in text


def test_a_record_from_before_the_runtimes_still_renders() -> None:
    torch_only = [p for p in POINTS if p.runtime == "torch"]
    old = record(torch_only, {"wide_mlp": RAW["wide_mlp"]})
    for entry in old["points"]:
        del entry["runtime"]
    del old["raw"]["threads"]
    points = [Point(**p) for p in old["points"]]
    text = report.markdown(old, points, targets(points, old["raw"]["models"], None))
    assert "torch threads 2." in text
    assert "| wide_mlp | torch | 2000 (64) | 1100 (64) | 55% |" in text
    assert "Weir peak / raw at batch 64 | 0.55 | ≥ 0.60 | **no** |" in text


def test_the_targets_are_torchs_and_need_no_torch_run() -> None:
    found = {t.name for t in targets(POINTS, RAW, None)}
    assert "Weir p99 at concurrency 8 (ms)" in found
    assert len([t for t in targets(POINTS, RAW, None) if "p99" in t.name]) == 2
    openvino_only = [p for p in POINTS if p.runtime == "openvino"]
    assert targets(openvino_only, {"wide_mlp_openvino": RAW["wide_mlp_openvino"]}, None) == []
    text = report.markdown(record(openvino_only, RAW), openvino_only, [])
    assert "Weir / baseline" not in text  # no torch, no baseline: that table is left out
    assert "| wide_mlp | openvino | 1800 (64) | 950 (8) | 53% |" in text


def test_a_variants_p99_goal_uses_its_own_runtimes_time_per_batch() -> None:
    onnx = point("weir", "onnxruntime", 8, 900.0, p50_ms=10.0, mean_batch=8.0)
    assert p99_bound_ms(onnx, RAW) == pytest.approx(20.0 + 8 / 2500.0 * 1e3)


def test_the_plot_draws_every_runtime(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the bench extra
    from bench.plot import save_plot

    save_plot(tmp_path / "plot.png", POINTS, RAW, ["wide_mlp"])
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
