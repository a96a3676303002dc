"""What the workers' TorchServe handlers recorded, as families of the metrics port.

Each worker publishes its handlers' series as a hash (:mod:`weir.handler_metrics`); at scrape
time the gateway reads the hashes that exist, adds up one series' counters across workers,
keeps its newest gauge value, and serves each under the handler's own name, as TorchServe's
frontend does (``PredictionTime{ModelName="m",Level="Model",Hostname="h"}``): every series
is served, as TorchServe's ``model_metrics_auto_detect`` would. A name that is not a valid
Prometheus name has its invalid characters replaced by ``_``; names in Weir's and Triton's
namespaces (``weir_``, ``nv_``) are not served, and the first type seen for a name holds.
"""

from __future__ import annotations

import redis
from prometheus_client.core import Metric

from weir import names
from weir.handler_metrics import HandlerSample, decode, merge, metric_name
from weir.redis_io.hashes import hashes_matching

RESERVED_PREFIXES = ("weir_", "nv_")


def handler_families(client: redis.Redis) -> list[Metric]:
    """The handlers' series from the workers' hashes that exist now; none when there are none."""
    found = hashes_matching(client, names.handler_metrics_pattern())
    samples = merge(sample for raw in found for sample in decode(raw))
    return families_of(samples)


def families_of(samples: list[HandlerSample]) -> list[Metric]:
    families: dict[str, Metric] = {}
    for sample in sorted(samples, key=lambda s: (s.name, s.labels)):
        name = metric_name(sample.name)
        if name.startswith(RESERVED_PREFIXES):
            continue
        family = families.get(name)
        if family is None:
            text = f"TorchServe handler {sample.kind} metric with unit: {sample.unit}"
            family = families[name] = Metric(name, text, sample.kind)
        if family.type == sample.kind:
            labels = {metric_name(key): value for key, value in sample.labels}
            family.add_sample(name, labels, sample.value)
    return list(families.values())
