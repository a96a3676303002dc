"""Per-request metrics, named like Triton's, observed where each request is answered.

Durations come from the stamps a request collects on its way through the mesh: queue time
runs from the gateway taking the request to a worker starting its batch; compute input,
infer and output are the worker's three phases; the request duration is the whole round
trip as the gateway saw it. Counters split success from failure (by reason).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from weir.stats import COMPUTE_INFER, COMPUTE_INPUT, COMPUTE_OUTPUT, QUEUE, REQUEST
from weir.wire import InferReply

LABELS = ("model", "version")
# Microseconds, from 50 µs to 30 s.
DURATION_BUCKETS_US = (
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000,
)  # fmt: skip

# Each phase's histogram, weir_inference_<phase>_duration_us, and its help text.
PHASES = {
    QUEUE: "time queued before a worker started the batch",
    COMPUTE_INPUT: "time gathering the batch's inputs",
    COMPUTE_INFER: "time running the model",
    COMPUTE_OUTPUT: "time splitting and encoding outputs",
    REQUEST: "end-to-end time inside the gateway",
}


@dataclass(frozen=True, slots=True)
class _Children:
    success: Counter
    phases: list[tuple[Histogram, str, str]]


class RequestMetrics:
    """The gateway's request counters and duration histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.success = Counter(
            "weir_inference_request_success", "Requests answered with outputs",
            LABELS, registry=registry,
        )  # fmt: skip
        self.failure = Counter(
            "weir_inference_request_failure", "Requests answered with an error",
            (*LABELS, "reason"), registry=registry,
        )  # fmt: skip
        self.durations = {
            phase.name: Histogram(
                f"weir_inference_{phase.name}_duration_us",
                f"Per request: {text} (microseconds)",
                LABELS,
                buckets=DURATION_BUCKETS_US,
                registry=registry,
            )
            for phase, text in PHASES.items()
        }
        self._phases = [(self.durations[p.name], p.start, p.end) for p in PHASES]
        # labels() takes a lock and builds a key on every call; each model's children are
        # looked up once.
        self._children: dict[tuple[str, str], _Children] = {}

    def answered(self, model: str, version: str, reply: InferReply) -> None:
        children = self._children.get((model, version))
        if children is None:
            children = self._children[(model, version)] = _Children(
                self.success.labels(model, version),
                [(h.labels(model, version), start, end) for h, start, end in self._phases],
            )
        children.success.inc()
        stamps = reply.ts
        for histogram, start, end in children.phases:
            if start in stamps and end in stamps:
                histogram.observe(max((stamps[end] - stamps[start]) / 1000, 0.0))

    def failed(self, model: str, version: str, reason: str) -> None:
        self.failure.labels(model, version, reason.upper()).inc()
