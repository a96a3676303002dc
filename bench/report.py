"""What a run leaves behind: the markdown table, the JSON record and the PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.analysis import (
    BASELINE,
    TORCH,
    TORCHSERVE,
    WEIR,
    WEIR_ARCHIVES,
    Point,
    Raw,
    Target,
    p99_bound_ms,
    ratios,
    runtime_summary,
    runtimes_served,
    select,
)
from bench.peer_report import cpu_table, memory_ratio, peer_table
from bench.redis_cost import redis_table
from bench.variants import served_name

# (model, runtime) pairs, in the order the tables list them.
Served = list[tuple[str, str]]


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _point_row(p: Point, raw: Raw) -> list[Any]:
    # A mean batch of 0 is one the server does not report (TorchServe): no goal from it.
    known = p.mean_batch > 0
    return [
        p.model,
        p.server,
        p.runtime,
        p.concurrency,
        f"{p.req_per_s:.0f}",
        f"{p.p50_ms:.2f}",
        f"{p.p90_ms:.2f}",
        f"{p.p99_ms:.2f}",
        f"{p99_bound_ms(p, raw):.2f}" if known else "-",
        f"{p.mean_batch:.1f}" if known else "-",
        p.errors,
        f"{p.other_cpu:.2f}",
    ]


def _models(served: Served) -> list[str]:
    return list(dict.fromkeys(model for model, _ in served))


def points_table(points: list[Point], raw: Raw, served: Served) -> list[str]:
    """Every point: per model the peers (baseline, TorchServe), then Weir through each runtime."""
    header = ["model", "server", "runtime", "concurrency", "req/s", "p50 ms", "p90 ms"]
    header += ["p99 ms", "p99 goal ms", "mean batch", "errors", "others' CPU"]
    rows = []
    for model in _models(served):
        chosen = select(points, BASELINE, model) + select(points, TORCHSERVE, model)
        chosen += select(points, WEIR_ARCHIVES, model)
        chosen += [p for m, r in served if m == model for p in select(points, WEIR, model, r)]
        rows += [_point_row(p, raw) for p in chosen]
    return _table(header, rows)


def raw_table(raw: Raw, served: Served) -> list[str]:
    if not served:
        return []
    names = [(m, r, served_name(m, r)) for m, r in served]
    sizes = [int(r["batch_size"]) for r in raw[names[0][2]]]
    rows = [
        [m, r, *(f"{c['samples_per_s']:.0f} ({_ms(c['batch_ms'])} ms)" for c in raw[name])]
        for m, r, name in names
    ]
    return _table(["model", "runtime", *(f"batch {b}" for b in sizes)], rows)


def _bold_best(values: list[float], text: list[str]) -> list[str]:
    """``text`` with the entry of the highest value in bold, when there are several."""
    top = max(values, default=0.0)
    if len(values) < 2 or top <= 0:
        return text
    return [f"**{t}**" if v == top else t for v, t in zip(values, text, strict=True)]


def _runtime_rows(points: list[Point], raw: Raw, served: Served, model: str) -> list[list[Any]]:
    found = [runtime_summary(points, raw, m, r) for m, r in served if m == model]
    raws = _bold_best(
        [f["raw_best"] for f in found],
        [f"{f['raw_best']:.0f} ({f['raw_best_batch']})" for f in found],
    )
    peaks = _bold_best(
        [f["weir_peak"] for f in found],
        [f"{f['weir_peak']:.0f} ({f['weir_peak_concurrency'] or '-'})" for f in found],
    )
    return [
        [model, f["runtime"], raw_cell, peak_cell, f"{f['weir_over_raw_best']:.0%}"]
        for f, raw_cell, peak_cell in zip(found, raws, peaks, strict=True)
    ]


def runtime_table(points: list[Point], raw: Raw, served: Served) -> list[str]:
    """Per model and runtime: the raw limit, Weir's peak through it, and their ratio."""
    header = ["model", "runtime", "raw best samples/s (batch)", "Weir peak req/s (concurrency)"]
    header.append("Weir / raw best")
    rows = [row for model in _models(served) for row in _runtime_rows(points, raw, served, model)]
    return _table(header, rows)


def _ratio_row(points: list[Point], raw: Raw, model: str) -> list[Any]:
    r = ratios(points, raw, model)
    return [
        model,
        f"{r['weir_peak']:.0f}",
        f"{r['baseline_peak']:.0f}",
        f"{r['raw_best']:.0f} ({r['raw_best_batch']:.0f})",
        f"{r['raw_max_batch']:.0f}",
        f"{r['weir_over_baseline']:.2f}x" if r["baseline_peak"] else "-",
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


def _parts(processes: list[dict[str, Any]]) -> str:
    return ", ".join(f"{p['label']} {p['rss_mib']:.0f}" for p in processes)


def memory_lines(memory: dict[str, Any]) -> list[str]:
    runtimes = ", ".join(memory.get("runtimes", [TORCH]))
    lines = [
        f"Weir's processes at their peak, serving through {runtimes}: "
        f"{memory['peak_total_mib']:.0f} MiB resident in all ({_parts(memory['processes'])}); "
        f"less {memory['weights_mib']:.0f} MiB of model files: "
        f"**{memory['peak_minus_weights_mib']:.0f} MiB**.",
    ]
    for name, peer in memory.get("peers", {}).items():
        total, parts = peer["peak_total_mib"], _parts(peer["processes"])
        lines += ["", f"{name}'s processes at their peak: {total:.0f} MiB in all ({parts})."]
    ratio = memory_ratio(memory)
    if ratio is not None:
        lines[-1] += f" Weir / TorchServe: **{ratio:.2f}**."
    elif TORCHSERVE in memory.get("peers", {}):
        lines[-1] += " Weir served other runtimes too: the totals do not compare."
    return lines


def _heading(record: dict[str, Any]) -> str:
    s, raw = record["settings"], record["raw"]
    threads = f"torch threads {raw['torch_threads']}"
    if "threads" in raw:
        threads += f", ONNX Runtime's and OpenVINO's {raw['threads']}"
    return (
        f"Run {record['date']} on {record['machine']['summary']}; {s['duration_s']} s per point "
        f"after {s['warmup_s']} s of warm-up, the best of {s.get('rounds', 1)} rounds, "
        f"{threads}."
    )


def markdown(record: dict[str, Any], points: list[Point], found: list[Target]) -> str:
    raw: Raw = record["raw"]["models"]
    served = [pair for pair in runtimes_served(points) if served_name(*pair) in raw]
    torch_models = [m for m, r in served if r == TORCH]
    lines = [
        _heading(record),
        "",
        "Raw limit, samples/s (ms per batch), the faster of the two runs (before, after):",
        "",
        *raw_table(raw, served),
        "",
        "Each runtime's raw limit (its best batch size, one batch at a time) and Weir's peak "
        "through it (at that concurrency); the fastest of each model in bold:",
        "",
        *runtime_table(points, raw, served),
        "",
    ]
    if torch_models:
        lines += [*ratio_table(points, raw, torch_models), ""]
    peers = peer_table(points, torch_models)
    if peers:
        lines += ["Weir against TorchServe (torch, the same bodies, alternating rounds):", ""]
        lines += [*peers, ""]
    archives = peer_table(points, torch_models, WEIR_ARCHIVES)
    if archives:
        lines += [
            "Weir serving TorchServe's archives (`weir up --ts-config` on TorchServe's own "
            "config.properties, asked through /predictions; the Weir columns) against "
            "TorchServe:",
            "",
            *archives,
            "",
        ]
    lines += [*points_table(points, raw, served), ""]
    cpu = cpu_table(points)
    if cpu:
        lines += ["CPU time per answered request, µs, by process of the server (`/proc`):", ""]
        lines += [*cpu, ""]
    redis_cost = redis_table(points)
    if redis_cost:
        lines += [
            "Weir's Redis cost per answered request (`INFO commandstats`, `INFO stats`), and "
            "what one Redis core could serve at that cost (1 s over the Redis process's CPU "
            "µs per request):",
            "",
            *redis_cost,
            "",
        ]
    lines += [
        *memory_lines(record["memory"]),
        "",
        *target_table(found),
    ]
    return "\n".join(lines) + "\n"


def write_json(path: Path, record: dict[str, Any]) -> None:
    path.write_text(json.dumps(record, indent=2) + "\n")
