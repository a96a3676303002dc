"""The request metrics of a one-process gateway (plain numbers, exposed when scraped) read
exactly as prometheus-client's own metric objects would, which a multi-process gateway
uses: the same series, bucket counts, sums and created stamps."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry
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


def samples(collected: bool, answered: list[tuple[str, str, InferReply]]) -> dict:
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, collected=collected)
    for model, version, reply in answered:
        metrics.answered(model, version, reply)
    metrics.failed("a", "1", "invalid")
    text = generate_latest(registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            found[key] = None if sample.name.endswith("_created") else sample.value
    return found


def test_collected_metrics_read_as_prometheus_clients_own() -> None:
    answered = replies(3, 400)
    collected, live = samples(True, answered), samples(False, answered)
    assert collected.keys() == live.keys()
    for key, value in live.items():
        if value is not None:
            assert collected[key] == value or abs(collected[key] - value) < 1e-6 * abs(value), key
    counts = [k for k in live if k[0] == "weir_inference_request_success_total"]
    assert sum(collected[k] for k in counts) == 400
    names = {name for name, _ in collected}
    for phase in PHASES:
        assert f"weir_inference_{phase.name}_duration_us_bucket" in names
