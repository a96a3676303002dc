"""The metrics TorchServe handlers record (``context.metrics``), on their way to the metrics port.

A TorchServe handler records metrics through its context: TorchServe's own ``PredictionTime``
(the time of each ``handle`` call), ``HandlerTime`` (``BaseHandler``'s), and any it names
itself. TorchServe's frontend serves them on its metrics port, each under the handler's
name, with the metric's dimensions and ``Hostname`` as labels. In Weir the handlers run in
the workers and the metrics port is the gateway's: each worker publishes what its handlers
recorded as one hash (:func:`weir.names.handler_metrics`), every few seconds, with a TTL of
a few intervals, and the gateway reads the hashes that exist when it is scraped.

A field is one series: its name, type, unit and labels; its value the series' value and when
it was last set. Several instances and workers may report one series: counters add up, and
for a gauge the value set last wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import orjson

COUNTER = "counter"
GAUGE = "gauge"
KINDS = (COUNTER, GAUGE)  # TorchServe's histograms are not served (see HandlerMetrics)

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")


@dataclass(frozen=True, slots=True)
class HandlerSample:
    """One series a handler recorded: name, kind, unit, labels in order; value; when set."""

    name: str
    kind: str
    unit: str
    labels: tuple[tuple[str, str], ...]
    value: float
    at_s: float  # wall clock, seconds: which of two workers' gauge values is the newer

    @property
    def series(self) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
        return (self.name, self.kind, self.unit, self.labels)


def encode(samples: Iterable[HandlerSample]) -> dict[bytes, bytes]:
    """The hash a worker publishes: one field per series."""
    return {
        orjson.dumps([s.name, s.kind, s.unit, s.labels]): orjson.dumps([s.value, s.at_s])
        for s in samples
    }


def decode(fields: Mapping[bytes, bytes]) -> list[HandlerSample]:
    """A published hash's samples; a field that is not one is skipped."""
    samples = []
    for key, raw in fields.items():
        try:
            name, kind, unit, labels = orjson.loads(key)
            value, at_s = orjson.loads(raw)
            pairs = tuple((str(k), str(v)) for k, v in labels)
            samples.append(HandlerSample(str(name), str(kind), str(unit), pairs, value, at_s))
        except (orjson.JSONDecodeError, TypeError, ValueError):
            continue
    return samples


def merge(samples: Iterable[HandlerSample]) -> list[HandlerSample]:
    """One sample per series: counters summed, the newest gauge value."""
    merged: dict[tuple[str, str, str, tuple[tuple[str, str], ...]], HandlerSample] = {}
    for sample in samples:
        known = merged.get(sample.series)
        if known is None:
            merged[sample.series] = sample
        elif sample.kind == COUNTER:
            at_s = max(known.at_s, sample.at_s)
            merged[sample.series] = replace(known, value=known.value + sample.value, at_s=at_s)
        elif sample.at_s > known.at_s:
            merged[sample.series] = sample
    return list(merged.values())


def metric_name(name: str) -> str:
    """``name`` as a Prometheus metric or label name: invalid characters become ``_``."""
    cleaned = _INVALID.sub("_", name) or "_"
    return f"_{cleaned}" if cleaned[0].isdigit() else cleaned
