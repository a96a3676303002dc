"""Pure computations on measured points: peaks, raw-limit look-ups, ratios and targets.

Nothing here measures or prints; ``tests/bench`` checks it on made-up numbers.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.variants import Runtime, served_name

WEIR = "weir"
BASELINE = "baseline"
TORCHSERVE = "torchserve"
# Weir serving TorchServe's archives through /predictions: `weir up --ts-config` on the
# TorchServe peer's own config.properties and archives.
WEIR_ARCHIVES = "weir-archives"
TORCH = Runtime.TORCH.value

# raw[name] is the list of {"batch_size", "batch_ms", "samples_per_s"} from bench.raw, by
# the name served: "wide_mlp" (torch), "wide_mlp_onnx", "wide_mlp_openvino".
Raw = dict[str, list[dict[str, float]]]


@dataclass(frozen=True)
class Point:
    """One closed-loop run of one server, model, runtime and concurrency."""

    server: str
    model: str
    concurrency: int
    req_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_batch: float
    requests: int
    errors: int
    other_cpu: float = 0.0  # cores other programs used meanwhile (bench.cpu)
    runtime: str = TORCH  # what computed the model (the baseline's is always torch)
    # µs of CPU per answered request, by process role of the server (bench.cpu)
    cpu_us_per_request: dict[str, float] = field(default_factory=dict)
    # Weir's Redis commands, bytes and time per answered request (bench.redis_cost)
    redis_per_request: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_us_total(self) -> float:
        """µs of CPU per answered request, every process of the server together."""
        return sum(self.cpu_us_per_request.values())

    @property
    def served(self) -> str:
        """The model's name on the server: its raw limit's key."""
        return served_name(self.model, self.runtime)


@dataclass(frozen=True)
class Target:
    """One goal from the issue, and whether this run met it."""

    model: str
    name: str
    measured: float
    goal: float
    at_least: bool

    @property
    def met(self) -> bool:
        compare: Callable[[float, float], bool] = operator.ge if self.at_least else operator.le
        return compare(self.measured, self.goal)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "met": self.met}


def fastest(first: Raw, second: Raw) -> Raw:
    """Per model and batch size, the faster of two raw measurements.

    The raw limit is measured before and after the servers' runs; a neighbour that was busy
    during one of them would otherwise lower the limit and flatter the servers.
    """
    return {
        model: [
            max(a, b, key=lambda r: r["samples_per_s"])
            for a, b in zip(first[model], second[model], strict=True)
        ]
        for model in first
    }


def select(points: list[Point], server: str, model: str, runtime: str = TORCH) -> list[Point]:
    return sorted(
        (p for p in points if (p.server, p.model, p.runtime) == (server, model, runtime)),
        key=lambda p: p.concurrency,
    )


def peak(points: list[Point], server: str, model: str, runtime: str = TORCH) -> float:
    """The highest req/s any concurrency reached; 0 when none was measured."""
    return max((p.req_per_s for p in select(points, server, model, runtime)), default=0.0)


def peak_point(points: list[Point], server: str, model: str, runtime: str) -> Point | None:
    """The point with the highest req/s; None when none was measured."""
    return max(select(points, server, model, runtime), key=lambda p: p.req_per_s, default=None)


def runtimes_served(points: list[Point]) -> list[tuple[str, str]]:
    """(model, runtime) pairs Weir served, in the order measured."""
    return list(dict.fromkeys((p.model, p.runtime) for p in points if p.server == WEIR))


def runtime_summary(points: list[Point], raw: Raw, model: str, runtime: str) -> dict[str, Any]:
    """One runtime's raw limit beside Weir's peak through it: the runtime table's row."""
    batch, best = raw_best(raw, served_name(model, runtime))
    top = peak_point(points, WEIR, model, runtime)
    served = top.req_per_s if top else 0.0
    return {
        "model": model,
        "runtime": runtime,
        "raw_best": best,
        "raw_best_batch": batch,
        "weir_peak": served,
        "weir_peak_concurrency": top.concurrency if top else None,
        "weir_over_raw_best": served / best,
    }


def raw_best(raw: Raw, model: str) -> tuple[int, float]:
    """(batch size, samples/s) of the fastest batch size."""
    best = max(raw[model], key=lambda r: r["samples_per_s"])
    return int(best["batch_size"]), best["samples_per_s"]


def raw_at(raw: Raw, model: str, batch_size: int) -> float:
    return next(r["samples_per_s"] for r in raw[model] if r["batch_size"] == batch_size)


def model_ms(raw: Raw, model: str, batch: float) -> float:
    """The model's time for one batch of ``batch`` rows, interpolated between measured sizes."""
    curve = sorted((r["batch_size"], r["batch_ms"]) for r in raw[model])
    if batch <= curve[0][0]:
        return curve[0][1]
    for (b0, ms0), (b1, ms1) in itertools.pairwise(curve):
        if batch <= b1:
            return ms0 + (ms1 - ms0) * (batch - b0) / (b1 - b0)
    return curve[-1][1] * batch / curve[-1][0]


def p99_bound_ms(point: Point, raw: Raw) -> float:
    """The latency goal at a point: p99 <= 2 x p50 + the model's time at the batch served."""
    return 2 * point.p50_ms + model_ms(raw, point.served, max(point.mean_batch, 1.0))


def ratios(points: list[Point], raw: Raw, model: str) -> dict[str, float]:
    weir, base = peak(points, WEIR, model), peak(points, BASELINE, model)
    best_batch, best = raw_best(raw, model)
    at_max = raw[model][-1]
    return {
        "weir_peak": weir,
        "baseline_peak": base,
        "raw_best": best,
        "raw_best_batch": best_batch,
        "raw_max_batch": at_max["samples_per_s"],
        "max_batch": at_max["batch_size"],
        "weir_over_baseline": weir / base if base else 0.0,
        "weir_over_raw_best": weir / best,
        "weir_over_raw_max_batch": weir / at_max["samples_per_s"],
    }


def _model_targets(points: list[Point], raw: Raw, model: str) -> list[Target]:
    r = ratios(points, raw, model)
    at_c1 = [p.p50_ms for p in select(points, WEIR, model) if p.concurrency == 1]
    goals: dict[str, list[Target]] = {
        "tiny_mlp": [
            Target(model, "Weir peak / baseline peak", r["weir_over_baseline"], 4.0, True),
            *(Target(model, "Weir p50 at concurrency 1 (ms)", v, 1.5, False) for v in at_c1),
        ],
        "wide_mlp": [
            Target(model, "Weir peak / raw at batch 64", r["weir_over_raw_max_batch"], 0.6, True),
            Target(model, "Weir peak / baseline peak", r["weir_over_baseline"], 7.0, True),
        ],
        "bert_mini": [
            Target(model, "Weir peak / raw at best batch", r["weir_over_raw_best"], 0.95, True),
        ],
    }
    found = goals.get(model, [])
    # Without the baseline in the run (--peers), its ratio is not measured, not missed.
    return [t for t in found if r["baseline_peak"] or "baseline" not in t.name]


def _tail_targets(points: list[Point], raw: Raw, model: str) -> list[Target]:
    return [
        Target(model, f"Weir p99 at concurrency {p.concurrency} (ms)", p.p99_ms, bound, False)
        for p in select(points, WEIR, model)
        for bound in [p99_bound_ms(p, raw)]
    ]


def targets(points: list[Point], raw: Raw, memory_mib: float | None) -> list[Target]:
    """Every goal of the issue that this run measured (they are torch's)."""
    models = sorted({p.model for p in points if p.runtime == TORCH}, key=list(raw).index)
    found = [
        t for m in models for t in (*_model_targets(points, raw, m), *_tail_targets(points, raw, m))
    ]
    if memory_mib is not None:
        found.append(Target("all", "Weir RSS less model weights (MiB)", memory_mib, 400.0, False))
    return found
