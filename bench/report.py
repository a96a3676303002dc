"""What a run leaves behind: the markdown table, the JSON record and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.analysis import BASELINE, WEIR, Point, Raw, Target, p99_bound_ms, ratios, select


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _point_row(p: Point, raw: Raw) -> list[Any]:
    return [
        p.model,
        p.server,
        p.concurrency,
        f"{p.req_per_s:.0f}",
        f"{p.p50_ms:.2f}",
        f"{p.p90_ms:.2f}",
        f"{p.p99_ms:.2f}",
        f"{p99_bound_ms(p, raw):.2f}",
        f"{p.mean_batch:.1f}",
        p.errors,
        f"{p.other_cpu:.2f}",
    ]


def points_table(points: list[Point], raw: Raw, models: list[str]) -> list[str]:
    header = ["model", "server", "concurrency", "req/s", "p50 ms", "p90 ms", "p99 ms"]
    header += ["p99 goal ms", "mean batch", "errors", "others' CPU"]
    rows = [
        _point_row(p, raw)
        for m in models
        for server in (BASELINE, WEIR)
        for p in select(points, server, m)
    ]
    return _table(header, rows)


def raw_table(raw: Raw, models: list[str]) -> list[str]:
    sizes = [int(r["batch_size"]) for r in raw[models[0]]]
    rows = [
        [m, *(f"{r['samples_per_s']:.0f} ({_ms(r['batch_ms'])} ms)" for r in raw[m])]
        for m in models
    ]
    return _table(["model", *(f"batch {b}" for b in sizes)], rows)


def _ratio_row(points: list[Point], raw: Raw, model: str) -> list[Any]:
    r = ratios(points, raw, model)
    return [
        model,
        f"{r['weir_peak']:.0f}",
        f"{r['baseline_peak']:.0f}",
        f"{r['raw_best']:.0f} ({r['raw_best_batch']:.0f})",
        f"{r['raw_max_batch']:.0f}",
        f"{r['weir_over_baseline']:.2f}x",
        f"{r['weir_over_raw_best']:.0%}",
        f"{r['weir_over_raw_max_batch']:.0%}",
    ]


def ratio_table(points: list[Point], raw: Raw, models: list[str]) -> list[str]:
    header = ["model", "Weir peak req/s", "baseline peak req/s", "raw best (batch)"]
    header += ["raw at max batch", "Weir / baseline", "Weir / raw best", "Weir / raw max batch"]
    return _table(header, [_ratio_row(points, raw, m) for m in models])


def _target_row(t: Target) -> list[Any]:
    goal = ("≥ " if t.at_least else "≤ ") + f"{t.goal:.2f}"
    return [t.model, t.name, f"{t.measured:.2f}", goal, "yes" if t.met else "**no**"]


def target_table(found: list[Target]) -> list[str]:
    header = ["model", "target", "measured", "goal", "met"]
    return _table(header, [_target_row(t) for t in found])


def memory_lines(memory: dict[str, Any]) -> list[str]:
    parts = ", ".join(f"{p['label']} {p['rss_mib']:.0f}" for p in memory["processes"])
    return [
        f"Weir's processes at their peak: {memory['peak_total_mib']:.0f} MiB resident in all "
        f"({parts}); less {memory['weights_mib']:.0f} MiB of model files: "
        f"**{memory['peak_minus_weights_mib']:.0f} MiB**.",
    ]


def markdown(record: dict[str, Any], points: list[Point], found: list[Target]) -> str:
    raw: Raw = record["raw"]["models"]
    models = [m for m in raw if any(p.model == m for p in points)]
    s = record["settings"]
    lines = [
        f"Run {record['date']} on {record['machine']['summary']}; {s['duration_s']} s per point "
        f"after {s['warmup_s']} s of warm-up, the best of {s.get('rounds', 1)} rounds, "
        f"torch threads {record['raw']['torch_threads']}.",
        "",
        "Raw limit, samples/s (ms per batch), the faster of the two runs (before, after):",
        "",
        *raw_table(raw, models),
        "",
        *ratio_table(points, raw, models),
        "",
        *points_table(points, raw, models),
        "",
        *memory_lines(record["memory"]),
        "",
        *target_table(found),
    ]
    return "\n".join(lines) + "\n"


def write_json(path: Path, record: dict[str, Any]) -> None:
    path.write_text(json.dumps(record, indent=2) + "\n")
