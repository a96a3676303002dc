"""``context.metrics``: TorchServe's metrics cache API, as a handler calls it.

What a handler records is kept per series in memory, as TorchServe's frontend keeps it: a
counter adds each value up, a gauge keeps the last one (a histogram too: Weir serves it as
the gauge of its last value). Each call without ``ModelName`` or ``Level`` among its
dimensions gets TorchServe's defaults (``ModelName`` the model, ``Level`` ``Model`` during
a batch, ``Error`` outside one). The worker publishes the series every few seconds
(:meth:`HandlerMetrics.samples`, :mod:`weir.handler_metrics`), and the gateway serves them
under the handler's names.

Units and types are taken as given: a call TorchServe accepts never raises here. Series are
updated from an instance's thread and read from the worker's event loop, under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from weir.handler_metrics import COUNTER, GAUGE, HandlerSample

logger = logging.getLogger(__name__)

MODEL_NAME = "ModelName"
LEVEL = "Level"


@dataclass
class RecordedMetric:
    """A metric a handler reported: a value per set of dimension values, and when it was set."""

    name: str
    unit: str
    dimension_names: list[str] = field(default_factory=list)
    metric_type: str = COUNTER
    values: dict[tuple[str, ...], float] = field(default_factory=dict)
    set_at_s: dict[tuple[str, ...], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_or_update(
        self, value: float, dimension_values: Iterable[Any] = (), request_id: str = ""
    ) -> None:
        """Record ``value`` for ``dimension_values`` (TorchServe's CachingMetric API)."""
        key = tuple(str(v) for v in dimension_values)
        with self.lock:
            if self.metric_type == COUNTER:
                self.values[key] = self.values.get(key, 0.0) + value
            else:
                self.values[key] = value
            self.set_at_s[key] = time.time()
        logger.debug("metric %s%s = %s %s %s", self.name, key, value, self.unit, request_id)

    def update(self, value: float, request_id: str = "", dimensions: Iterable[Any] = ()) -> None:
        """The older API: dimensions as Dimension objects (with ``.value``)."""
        self.add_or_update(value, [getattr(d, "value", d) for d in dimensions], request_id)

    def samples(self) -> list[HandlerSample]:
        kind = COUNTER if self.metric_type == COUNTER else GAUGE
        names = self.dimension_names
        with self.lock:
            recorded = [
                (key, value, self.set_at_s.get(key, 0.0)) for key, value in self.values.items()
            ]
        return [
            HandlerSample(
                self.name, kind, self.unit, tuple(zip(names, key, strict=True)), value, at
            )
            for key, value, at in recorded
            if len(key) == len(names)
        ]


class HandlerMetrics:
    """``context.metrics``: TorchServe's metrics cache API (see the module)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.cache: dict[tuple[str, str], RecordedMetric] = {}
        self.request_ids: Any = None

    def set_request_ids(self, request_ids: Any) -> None:
        self.request_ids = request_ids

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: Iterable[str] = (),
        metric_type: Any = COUNTER,
    ) -> RecordedMetric:
        kind = _type_name(metric_type)
        metric = RecordedMetric(metric_name, unit, list(dimension_names), kind)
        self.cache[(kind, metric_name)] = metric
        return metric

    def get_metric(self, metric_name: str, metric_type: Any = COUNTER) -> RecordedMetric:
        """The metric of that name and type; created unitless if the handler made none."""
        metric = self.cache.get((_type_name(metric_type), metric_name))
        return metric or self.add_metric_to_cache(metric_name, "", (), metric_type)

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any = None,
        dimensions: Iterable[Any] = (),
        metric_type: Any = COUNTER,
    ) -> None:
        self._record(name, value, unit, dimensions, metric_type)

    def add_counter(
        self, name: str, value: float, idx: Any = None, dimensions: Iterable[Any] = ()
    ) -> None:
        self._record(name, value, "count", dimensions, COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "ms",
        dimensions: Iterable[Any] = (),
        metric_type: Any = GAUGE,
    ) -> None:
        self._record(name, value, unit, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "MB",
        dimensions: Iterable[Any] = (),
        metric_type: Any = GAUGE,
    ) -> None:
        self._record(name, value, unit, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: Any = None,
        dimensions: Iterable[Any] = (),
        metric_type: Any = GAUGE,
    ) -> None:
        self._record(name, value, "percent", dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: Iterable[Any] = ()) -> None:
        self._record(name, value, "", dimensions, COUNTER)

    def samples(self) -> list[HandlerSample]:
        """Every series recorded so far (a snapshot, for the worker's publisher)."""
        return [sample for metric in list(self.cache.values()) for sample in metric.samples()]

    def _record(
        self, name: str, value: float, unit: str, dimensions: Iterable[Any], metric_type: Any
    ) -> None:
        pairs = self._with_defaults(
            [(str(getattr(d, "name", d)), getattr(d, "value", d)) for d in dimensions]
        )
        metric = self.cache.get((_type_name(metric_type), name))
        if metric is None:
            names = [dim_name for dim_name, _ in pairs]
            metric = self.add_metric_to_cache(name, unit, names, metric_type)
        metric.add_or_update(value, [dim_value for _, dim_value in pairs])

    def _with_defaults(self, pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        # TorchServe's defaults: during a batch the model and Level=Model, outside "Error".
        names = {dim_name for dim_name, _ in pairs}
        if self.request_ids is None:
            return pairs if LEVEL in names else [*pairs, (LEVEL, "Error")]
        if MODEL_NAME not in names:
            pairs.append((MODEL_NAME, self.model_name))
        if LEVEL not in names:
            pairs.append((LEVEL, "Model"))
        return pairs


def _type_name(metric_type: Any) -> str:
    """A MetricTypes member (``.value``) or a plain string, as a lower-case name."""
    return str(getattr(metric_type, "value", metric_type)).lower()
