"""Per-request metrics, named like Triton's, observed where each request is answered.

Durations come from the stamps a request collects on its way through the mesh: queue time
runs from the gateway taking the request to a worker starting its batch; compute input,
infer and output are the worker's three phases; the request duration is the whole round
trip as the gateway saw it. Counters split success from failure (by reason).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, Metric
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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
    phases: list[Histogram]


class RequestMetrics:
    """The gateway's request counters and duration histograms.

    A request's outcome is a few integer additions: counts and sums are kept in plain lists
    (:class:`_Collected`), a tenth of the gateway's CPU per request less than
    prometheus-client's locked values. In a gateway of one process (``collected``) the
    registry reads them when it is scraped. A process of a multi-process gateway hands them
    to prometheus-client's multi-process files, which the parent serves, every
    ``flush_s`` (:meth:`flush`): observed on those files one by one, prometheus-client's
    memory-mapped values cost each process of such a gateway about 9 % of its CPU (a
    profile of two processes under load); a scrape now sees a process's answers up to
    ``flush_s`` late.
    """

    def __init__(
        self, registry: CollectorRegistry, collected: bool = True, count_responses: bool = False
    ) -> None:
        # With ``count_responses``: every HTTP response, by its status class
        # (weir_http_responses; TorchServe's Requests2XX, 4XX and 5XX derive from it).
        self.counts_responses = count_responses
        self.failure = Counter(
            "weir_inference_request_failure", "Requests answered with an error",
            (*LABELS, "reason"), registry=registry,
        )  # fmt: skip
        self._collected = _Collected(count_responses)
        self.shared = not collected
        if collected:
            registry.register(self._collected)
            return
        self._responses: list[Counter] = []
        if count_responses:
            family = Counter(RESPONSES, RESPONSES_HELP, ("status_class",), registry=registry)
            self._responses = [family.labels(c) for c in STATUS_CLASSES]
        self.success = Counter(
            "weir_inference_request_success", SUCCESS_HELP, LABELS, registry=registry
        )
        self.durations = {
            phase.name: Histogram(
                _histogram_name(phase.name), _histogram_help(text), LABELS,
                buckets=DURATION_BUCKETS_US, registry=registry,
            )
            for phase, text in PHASES.items()
        }  # fmt: skip
        # labels() takes a lock and builds a key on every call; each model's children are
        # looked up once.
        self._children: dict[tuple[str, str], _Children] = {}

    def answered(self, model: str, version: str, reply: InferReply) -> None:
        self._collected.answered(model, version, reply.ts)

    def flush(self) -> None:
        """Hand what was answered since the last flush to the multi-process files (shared)."""
        if not self.shared:
            return
        collected = self._collected
        models, collected.models = collected.models, {}
        responses, collected.responses = collected.responses, [0] * len(STATUS_CLASSES)
        for counter, count in zip(self._responses, responses, strict=False):
            if count:
                counter.inc(count)
        for (model, version), counts in models.items():
            children = self._children.get((model, version))
            if children is None:
                children = self._children[(model, version)] = _Children(
                    self.success.labels(model, version),
                    [self.durations[p.name].labels(model, version) for p in PHASES],
                )
            if counts.success:
                children.success.inc(counts.success)
            for histogram, buckets, total in zip(
                children.phases, counts.buckets, counts.sums, strict=True
            ):
                _observed(histogram, buckets, total)

    async def flush_every(self, interval_s: float) -> None:
        """:meth:`flush` every ``interval_s``, until cancelled (then once more)."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                self.flush()
        finally:
            self.flush()

    def failed(self, model: str, version: str, reason: str) -> None:
        self.failure.labels(model, version, reason.upper()).inc()

    def responded(self, status: int) -> None:
        """One HTTP response was sent with ``status`` (only with ``count_responses``)."""
        self._collected.responses[_status_index(status)] += 1


def _observed(histogram: Histogram, buckets: list[int], total: float) -> None:
    """Add observations counted per bucket (not cumulative) and their sum to ``histogram``.

    What ``observe`` does for each, in one addition per bucket: the buckets are the same
    bounds (:data:`_BOUNDS`) and the same rule, the first bound an observation does not pass.
    """
    if not any(buckets):
        return
    # prometheus-client has no public way to add many observations at once.
    histogram._sum.inc(total)
    for value, count in zip(histogram._buckets, buckets, strict=True):
        if count:
            value.inc(count)


RESPONSES = "weir_http_responses"
RESPONSES_HELP = "HTTP responses sent, by status class"
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def _status_index(status: int) -> int:
    return min(max(status // 100 - 1, 0), len(STATUS_CLASSES) - 1)


SUCCESS_HELP = "Requests answered with outputs"
_SPANS = [(phase.start, phase.end) for phase in PHASES]
# prometheus-client's rule: an observation counts in the first bucket whose bound it does
# not pass (bisect_left), the last one being +Inf.
_BOUNDS = (*map(float, DURATION_BUCKETS_US), math.inf)
_LE = [floatToGoString(bound) for bound in _BOUNDS]  # type: ignore[no-untyped-call]


def _histogram_name(phase: str) -> str:
    return f"weir_inference_{phase}_duration_us"


def _histogram_help(text: str) -> str:
    return f"Per request: {text} (microseconds)"


class _Model:
    """One model version's outcomes: success count, and per phase its buckets and sum."""

    __slots__ = ("buckets", "created", "success", "sums")

    def __init__(self) -> None:
        self.created = time.time()
        self.success = 0
        self.buckets = [[0] * len(_BOUNDS) for _ in _SPANS]
        self.sums = [0.0] * len(_SPANS)


class _Collected:
    """Success counts and phase histograms kept as plain numbers, exposed when scraped.

    Written on the event loop, read by the scrape's thread: each number is read whole,
    and a scrape that falls between a request's additions shows it in some series only,
    as prometheus-client's own values would.
    """

    def __init__(self, count_responses: bool) -> None:
        self.models: dict[tuple[str, str], _Model] = {}
        self.counts_responses = count_responses
        self.responses = [0] * len(STATUS_CLASSES)
        self._created = time.time()

    def answered(self, model: str, version: str, stamps: dict[str, int]) -> None:
        counts = self.models.get((model, version))
        if counts is None:
            counts = self.models[(model, version)] = _Model()
        counts.success += 1
        for i, (start, end) in enumerate(_SPANS):
            begun = stamps.get(start)
            ended = stamps.get(end)
            if begun is not None and ended is not None:
                duration_us = max((ended - begun) / 1000, 0.0)
                counts.buckets[i][bisect.bisect_left(_BOUNDS, duration_us)] += 1
                counts.sums[i] += duration_us

    def describe(self) -> list[Metric]:
        return []  # nothing to check against the registry's other names up front

    def collect(self) -> Iterator[Metric]:
        models = list(self.models.items())
        success = CounterMetricFamily("weir_inference_request_success", SUCCESS_HELP, labels=LABELS)
        for labels, counts in models:
            success.add_metric(labels, counts.success, created=counts.created)
        yield success
        for i, (phase, text) in enumerate(PHASES.items()):
            name = _histogram_name(phase.name)
            family = HistogramMetricFamily(name, _histogram_help(text), labels=LABELS)
            for labels, counts in models:
                cumulative = itertools.accumulate(counts.buckets[i])
                family.add_metric(labels, list(zip(_LE, cumulative, strict=True)), counts.sums[i])
                named = dict(zip(LABELS, labels, strict=True))
                family.samples.append(Sample(f"{name}_created", named, counts.created))
            yield family
        if self.counts_responses:
            responses = CounterMetricFamily(RESPONSES, RESPONSES_HELP, labels=("status_class",))
            for status_class, count in zip(STATUS_CLASSES, self.responses, strict=True):
                responses.add_metric([status_class], count, created=self._created)
            yield responses
