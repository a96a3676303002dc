"""The report's tables against TorchServe, and of CPU per request by process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.analysis import TORCH, TORCHSERVE, WEIR, Point, peak, select


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


def _model_rows(points: list[Point], model: str) -> list[list[Any]]:
    weir = {p.concurrency: p for p in select(points, WEIR, model, TORCH)}
    peer = {p.concurrency: p for p in select(points, TORCHSERVE, model, TORCH)}
    return [_pair_row(model, c, weir.get(c), peer.get(c)) for c in sorted({*weir, *peer})]


def peer_summary(points: list[Point], model: str) -> dict[str, float]:
    """Weir's and TorchServe's peak req/s for a torch model, and their ratio (0: no peer)."""
    weir, peer = peak(points, WEIR, model), peak(points, TORCHSERVE, model)
    ratio = weir / peer if peer else 0.0
    return {"weir_peak": weir, "torchserve_peak": peer, "weir_over_torchserve": ratio}


def peer_table(points: list[Point], models: list[str]) -> list[str]:
    """Per torch model and concurrency, Weir beside TorchServe; [] when TorchServe did not run."""
    chosen = [m for m in models if select(points, TORCHSERVE, m, TORCH)]
    if not chosen:
        return []
    header = ["model", "concurrency", "Weir req/s", "TorchServe req/s", "Weir / TorchServe"]
    header += ["Weir p50 / p99 ms", "TorchServe p50 / p99 ms", "Weir CPU µs/req"]
    header.append("TorchServe CPU µs/req")
    rows = [row for m in chosen for row in _model_rows(points, m)]
    for m in chosen:
        s = peer_summary(points, m)
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
