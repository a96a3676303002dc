"""The request metrics read exactly as prometheus-client's own metric objects would, had
each reply been observed on them: in a one-process gateway (plain numbers, exposed when
scraped) and in a process of a multi-process gateway (the same numbers added to
prometheus-client's metric objects at each flush, in one addition per bucket): the same
series, bucket counts and sums."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import DURATION_BUCKETS_US, PHASES, RequestMetrics
from weir.stats import Stamp
from weir.wire import InferReply

ORDER = [
    Stamp.GATEWAY_IN, Stamp.COMPUTE_START, Stamp.COMPUTE_INPUT_END, Stamp.COMPUTE_INFER_END,
    Stamp.COMPUTE_END, Stamp.GATEWAY_OUT,
]  # fmt: skip


def replies(seed: int, count: int) -> list[tuple[str, str, InferReply]]:
    rng = random.Random(seed)
    edges = [0, *DURATION_BUCKETS_US]  # durations on, just under and past every bound
    answered = []
    for i in range(count):
        now_ns, stamps = 1_000_000_000, {}
        for stamp in ORDER:
            stamps[stamp] = now_ns
            bound = rng.choice(edges)
            now_ns += int(rng.choice([bound, bound - 1, bound + 1, 40_000_000]) * 1000) // 1
        if i % 7 == 0:
            del stamps[Stamp.COMPUTE_INPUT_END]  # a reply without a phase's stamps
        if i % 11 == 0:
            stamps[Stamp.GATEWAY_OUT] = stamps[Stamp.GATEWAY_IN] - 5_000  # clocks apart
        model, version = rng.choice([("a", "1"), ("a", "2"), ("b", "1")])
        answered.append((model, version, InferReply(str(i), model, version, ts=stamps)))
    return answered


def read(registry: CollectorRegistry) -> dict:
    text = generate_latest(registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            found[key] = None if sample.name.endswith("_created") else sample.value
    return found


def observed(answered: list[tuple[str, str, InferReply]]) -> dict:
    """Each reply observed on prometheus-client's own objects, one by one: the reference."""
    registry = CollectorRegistry()
    labels = ("model", "version")
    success = Counter("weir_inference_request_success", "s", labels, registry=registry)
    failure = Counter("weir_inference_request_failure", "f", (*labels, "reason"), registry=registry)
    phases = [
        (Histogram(f"weir_inference_{p.name}_duration_us", "h", labels,
                   buckets=DURATION_BUCKETS_US, registry=registry), p.start, p.end)
        for p in PHASES
    ]  # fmt: skip
    for model, version, reply in answered:
        success.labels(model, version).inc()
        for histogram, start, end in phases:
            if start in reply.ts and end in reply.ts:
                duration = max((reply.ts[end] - reply.ts[start]) / 1000, 0.0)
                histogram.labels(model, version).observe(duration)
    failure.labels("a", "1", "INVALID").inc()
    return read(registry)


def metered(collected: bool, answered: list[tuple[str, str, InferReply]], flushes: int) -> dict:
    """The replies through :class:`RequestMetrics`, flushed ``flushes`` times along the way."""
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, collected=collected)
    every = max(len(answered) // max(flushes, 1), 1)
    for index, (model, version, reply) in enumerate(answered, 1):
        metrics.answered(model, version, reply)
        if flushes and index % every == 0:
            metrics.flush()
    metrics.failed("a", "1", "invalid")
    metrics.flush()
    return read(registry)


def same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        if value is not None:
            assert got[key] == value or abs(got[key] - value) < 1e-6 * abs(value), key


def test_collected_metrics_read_as_prometheus_clients_own() -> None:
    answered = replies(3, 400)
    expected = observed(answered)
    collected = metered(True, answered, flushes=0)
    same(collected, expected)
    counts = [k for k in expected if k[0] == "weir_inference_request_success_total"]
    assert sum(collected[k] for k in counts) == 400
    names = {name for name, _ in collected}
    for phase in PHASES:
        assert f"weir_inference_{phase.name}_duration_us_bucket" in names


def test_a_multi_process_gateway_s_flushes_add_up_to_every_observation() -> None:
    answered = replies(4, 400)
    expected = observed(answered)
    for flushes in (1, 7, 400):  # once at the end; now and then; after every reply
        same(metered(False, answered, flushes), expected)
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, collected=False)
    model, version, reply = answered[0]
    metrics.answered(model, version, reply)
    assert not any(k[0] == "weir_inference_request_success_total" for k in read(registry))
    metrics.flush()  # nothing reaches the shared metric objects before a flush
    key = ("weir_inference_request_success_total", (("model", model), ("version", version)))
    assert read(registry)[key] == 1
