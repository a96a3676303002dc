"""The report's tables against TorchServe, of CPU per request by process, and the goals
against TorchServe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.analysis import TORCH, TORCHSERVE, WEIR, Point, Target, peak, select


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _cpu(point: Point | None) -> str:
    return f"{point.cpu_us_total:.0f}" if point and point.cpu_us_per_request else "-"


def _rate(point: Point) -> str:
    return f"{point.req_per_s:.0f}"


def _latency(point: Point) -> str:
    return f"{point.p50_ms:.2f} / {point.p99_ms:.2f}"


def _or_dash(point: Point | None, text: Callable[[Point], str]) -> str:
    return text(point) if point is not None else "-"


def _pair_row(model: str, concurrency: int, weir: Point | None, peer: Point | None) -> list[Any]:
    ratio = "-"
    if weir is not None and peer is not None and peer.req_per_s:
        ratio = f"{weir.req_per_s / peer.req_per_s:.2f}x"
    return [
        model,
        concurrency,
        _or_dash(weir, _rate),
        _or_dash(peer, _rate),
        ratio,
        _or_dash(weir, _latency),
        _or_dash(peer, _latency),
        _cpu(weir),
        _cpu(peer),
    ]


def _model_rows(points: list[Point], model: str, server: str = WEIR) -> list[list[Any]]:
    weir = {p.concurrency: p for p in select(points, server, model, TORCH)}
    peer = {p.concurrency: p for p in select(points, TORCHSERVE, model, TORCH)}
    return [_pair_row(model, c, weir.get(c), peer.get(c)) for c in sorted({*weir, *peer})]


def peer_summary(points: list[Point], model: str, server: str = WEIR) -> dict[str, float]:
    """Weir's and TorchServe's peak req/s for a torch model, and their ratio (0: no peer).

    ``server``: which Weir (its own configs, or TorchServe's archives: WEIR_ARCHIVES).
    """
    weir, peer = peak(points, server, model), peak(points, TORCHSERVE, model)
    ratio = weir / peer if peer else 0.0
    return {"weir_peak": weir, "torchserve_peak": peer, "weir_over_torchserve": ratio}


def peer_table(points: list[Point], models: list[str], server: str = WEIR) -> list[str]:
    """Per torch model and concurrency, Weir (``server``) beside TorchServe; [] when either
    did not run."""
    chosen = [
        m for m in models if select(points, TORCHSERVE, m, TORCH) and select(points, server, m)
    ]
    if not chosen:
        return []
    header = ["model", "concurrency", "Weir req/s", "TorchServe req/s", "Weir / TorchServe"]
    header += ["Weir p50 / p99 ms", "TorchServe p50 / p99 ms", "Weir CPU µs/req"]
    header.append("TorchServe CPU µs/req")
    rows = [row for m in chosen for row in _model_rows(points, m, server)]
    for m in chosen:
        s = peer_summary(points, m, server)
        peaks = [f"**{s['weir_peak']:.0f}**", f"**{s['torchserve_peak']:.0f}**"]
        rows.append([m, "peak", *peaks, f"**{s['weir_over_torchserve']:.2f}x**", "", "", "", ""])
    return _table(header, rows)


def by_process(cpu: dict[str, float]) -> str:
    """``gateway 125, worker 47, ...``: each role's µs per request, the largest first."""
    ranked = sorted(cpu.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{role} {us:.0f}" for role, us in ranked)


def _cpu_row(p: Point) -> list[Any]:
    total = f"{p.cpu_us_total:.0f}"
    return [
        p.model,
        p.concurrency,
        p.server,
        p.runtime,
        _rate(p),
        total,
        by_process(p.cpu_us_per_request),
    ]


def cpu_table(points: list[Point]) -> list[str]:
    """Per point and server, CPU µs per answered request: in all, and by process."""
    measured = [p for p in points if p.cpu_us_per_request]
    if not measured:
        return []
    header = ["model", "concurrency", "server", "runtime", "req/s", "CPU µs/req", "by process"]
    models = list(dict.fromkeys(p.model for p in measured))
    order = sorted(measured, key=lambda p: (models.index(p.model), p.concurrency, p.server))
    rows = [_cpu_row(p) for p in order]
    return _table(header, rows)


# The goals against TorchServe (plain configs, one run): Weir's req/s over TorchServe's at a
# concurrency; Weir's CPU per request (µs), in all and in the gateway; Weir's p50 at
# concurrency 1 over TorchServe's; every Weir process's peak memory over TorchServe's tree.
RATE_GOALS = [("tiny_mlp", 64, 1.5), ("wide_mlp", 64, 2.5), ("bert_mini", 8, 1.3)]
RATE_GOALS.append(("bert_mini", 64, 1.3))
CPU_GOALS = [("tiny_mlp", 64, "", 200.0), ("tiny_mlp", 64, "gateway", 100.0)]
P50_AT_ONE_GOAL = 0.25
MEMORY_GOAL = 0.8


def _at(points: list[Point], server: str, model: str, concurrency: int) -> Point | None:
    found = [p for p in select(points, server, model, TORCH) if p.concurrency == concurrency]
    return found[0] if found else None


def _pairs(points: list[Point], model: str, concurrency: int) -> tuple[Point, Point] | None:
    weir, peer = _at(points, WEIR, model, concurrency), _at(points, TORCHSERVE, model, concurrency)
    return (weir, peer) if weir is not None and peer is not None else None


def peer_targets(points: list[Point], memory: dict[str, Any]) -> list[Target]:
    """The goals against TorchServe that this run measured (torch, both servers)."""
    found: list[Target] = []
    for model, concurrency, goal in RATE_GOALS:
        pair = _pairs(points, model, concurrency)
        if pair and pair[1].req_per_s:
            name = f"Weir / TorchServe req/s at concurrency {concurrency}"
            found.append(Target(model, name, pair[0].req_per_s / pair[1].req_per_s, goal, True))
    for model, concurrency, part, goal in CPU_GOALS:
        weir = _at(points, WEIR, model, concurrency)
        if weir is None or not weir.cpu_us_per_request:
            continue
        measured = weir.cpu_us_per_request.get(part, 0.0) if part else weir.cpu_us_total
        name = f"Weir {part or 'all processes'} CPU µs/req at concurrency {concurrency}"
        found.append(Target(model, name, measured, goal, False))
    models = dict.fromkeys(p.model for p in points if p.runtime == TORCH)
    for model in models:
        pair = _pairs(points, model, 1)
        if pair and pair[1].p50_ms:
            name = "Weir p50 / TorchServe p50 at concurrency 1"
            found.append(
                Target(model, name, pair[0].p50_ms / pair[1].p50_ms, P50_AT_ONE_GOAL, False)
            )
    ratio = memory_ratio(memory)
    if ratio is not None:
        # Every model of the run at once: TorchServe runs a process per model instance,
        # Weir one worker for all, so the ratio is the set's; a run of one model is its own.
        served = " + ".join(memory.get("models", ["all"]))
        found.append(Target(served, "Weir RSS / TorchServe RSS", ratio, MEMORY_GOAL, False))
    return found


def memory_ratio(memory: dict[str, Any]) -> float | None:
    """Weir's peak memory over TorchServe's, when both served the same (torch) models."""
    peer = memory.get("peers", {}).get(TORCHSERVE)
    if peer is None or memory.get("runtimes") != [TORCH] or not peer["peak_total_mib"]:
        return None
    return float(memory["peak_total_mib"] / peer["peak_total_mib"])
