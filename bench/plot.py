"""The PNG: throughput against concurrency, and p99 against throughput, per model."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot's import
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, ScalarFormatter

from bench.analysis import BASELINE, TORCH, TORCHSERVE, WEIR, Point, Raw, raw_best, select
from bench.variants import Runtime, served_name

# The raw limit is drawn when within this factor of the best server's req/s.
OFF_SCALE = 10.0
# (server, runtime): (colour, marker, label); a runtime's raw limit is drawn in its colour.
STYLES = {
    (WEIR, TORCH): ("tab:blue", "o", "weir torch"),
    (BASELINE, TORCH): ("tab:orange", "s", "baseline"),
    (TORCHSERVE, TORCH): ("tab:red", "D", "torchserve"),
    (WEIR, Runtime.ONNXRUNTIME.value): ("tab:green", "^", "weir onnxruntime"),
    (WEIR, Runtime.OPENVINO.value): ("tab:purple", "v", "weir openvino"),
}


def _raw_line(ax: Axes, raw: Raw, model: str, runtime: str, measured: float) -> None:
    """The runtime's raw limit, dashed in its colour (torch's gray), unless off scale."""
    batch, best = raw_best(raw, served_name(model, runtime))
    color = "gray" if runtime == TORCH else STYLES[(WEIR, runtime)][0]
    label = f"raw {runtime}"
    if best <= OFF_SCALE * measured:
        ax.axhline(best, color=color, linestyle="--", label=f"{label} (batch {batch})")
    else:  # a line far above the servers would flatten them to the axis
        ax.plot([], [], " ", label=f"{label} {best:,.0f}/s (batch {batch}), off scale")


def _throughput(ax: Axes, points: list[Point], raw: Raw, model: str) -> None:
    measured = max((p.req_per_s for p in points if p.model == model), default=0.0)
    for (server, runtime), (color, marker, label) in STYLES.items():
        chosen = select(points, server, model, runtime)
        if not chosen:
            continue
        xs = [p.concurrency for p in chosen]
        ax.plot(xs, [p.req_per_s for p in chosen], marker=marker, color=color, label=label)
        if server == WEIR and served_name(model, runtime) in raw:
            _raw_line(ax, raw, model, runtime, measured)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({p.concurrency for p in points if p.model == model}))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_title(model)
    ax.set_xlabel("concurrency (connections)")
    ax.set_ylabel("req/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")


def _two_and_five(value: float, _: object) -> str:
    """Minor log ticks: label only 2 and 5 of each decade, so labels never overlap."""
    leading = round(value / 10 ** math.floor(math.log10(value))) if value > 0 else 0
    return f"{value:g}" if leading in (2, 5) else ""


def _tail(ax: Axes, points: list[Point], model: str) -> None:
    for (server, runtime), (color, marker, label) in STYLES.items():
        chosen = select(points, server, model, runtime)
        if not chosen:
            continue
        xs = [p.req_per_s for p in chosen]
        ax.plot(xs, [p.p99_ms for p in chosen], marker=marker, color=color, label=label)
        for p in chosen:
            ax.annotate(f"c{p.concurrency}", (p.req_per_s, p.p99_ms), fontsize="x-small")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))
    ax.set_xlabel("req/s")
    ax.set_ylabel("p99 latency (ms)")
    ax.legend(fontsize="small")


def save_plot(path: Path, points: list[Point], raw: Raw, models: list[str]) -> None:
    fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 8), squeeze=False)
    for column, model in enumerate(models):
        _throughput(axes[0][column], points, raw, model)
        _tail(axes[1][column], points, model)
    fig.suptitle(
        "Weir through each runtime against a naive FastAPI baseline (closed loop, wrk -t1)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
