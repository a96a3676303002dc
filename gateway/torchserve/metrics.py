"""TorchServe's metric names on the metrics port of a gateway that serves TorchServe's APIs.

A dashboard or alert written for TorchServe's metrics API (``metrics_mode=prometheus``)
reads the same series from Weir. They are derived, at scrape time, from the families the
scrape collects anyway, so a gateway of one process and one of many (prometheus-client's
multi-process files) show the same numbers, and the hot path records nothing more for them:

- ``ts_inference_requests_total``: inference requests answered, with outputs or an error
  (``weir_inference_request_success`` plus ``weir_inference_request_failure``);
- ``ts_inference_latency_microseconds``: the summed latency of the requests answered with
  outputs (``weir_inference_request_duration_us``'s sum), as TorchServe sums its jobs';
- ``ts_queue_latency_microseconds``: their summed time queued until a worker started their
  batch (``weir_inference_queue_duration_us``'s sum);
- ``Requests2XX``, ``Requests4XX``, ``Requests5XX``: responses of the inference and
  management ports by status class (``weir_http_responses``); as in TorchServe, every
  status outside 2xx and 4xx counts as 5XX;
- the host's gauges (:mod:`gateway.torchserve.host_metrics`) and, from the gpu-pool
  workers' samples, ``GPUUtilization``, ``GPUMemoryUsed`` and ``GPUMemoryUtilization``.

The three ``ts_*`` series carry ``model_name``, ``model_version`` and ``hostname``, the
others ``Level="Host"`` and ``Hostname``, as TorchServe's do. ``model_version`` is the
TorchServe version string of the version that answered (``1.0``), or Weir's version for a
model that is not the store's; TorchServe writes ``default`` when the request named none.
"""

from __future__ import annotations

import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Metric
from prometheus_client.registry import Collector

from gateway.torchserve.host_metrics import HostSampler
from weir import names
from weir.torchserve.store import ModelStore, StoreError

REQUESTS = "ts_inference_requests_total"
LATENCY = "ts_inference_latency_microseconds"
QUEUE_LATENCY = "ts_queue_latency_microseconds"

# Weir's samples each TorchServe series is summed from.
_REQUEST_SAMPLES = ("weir_inference_request_success_total", "weir_inference_request_failure_total")
_LATENCY_SAMPLE = "weir_inference_request_duration_us_sum"
_QUEUE_SAMPLE = "weir_inference_queue_duration_us_sum"
_RESPONSES_SAMPLE = "weir_http_responses_total"
# TorchServe's counters of responses, by the status classes each sums.
_RESPONSE_COUNTERS = (
    ("Requests2XX", ("2xx",)),
    ("Requests4XX", ("4xx",)),
    ("Requests5XX", ("1xx", "3xx", "5xx")),
)
_MIB = 1024 * 1024

Series = dict[tuple[str, str], float]


class TorchServeNames(Collector):
    """The families of ``inner``, then TorchServe's names derived from them."""

    def __init__(
        self,
        inner: CollectorRegistry,
        ts_version: Callable[[str, str], str],
        hostname: str | None = None,
        host: HostSampler | None = None,
    ) -> None:
        self.inner = inner
        self.ts_version = ts_version
        self.hostname = hostname or socket.gethostname()
        self.host = host or HostSampler()

    def collect(self) -> Iterator[Metric]:
        families = list(self.inner.collect())
        yield from families
        yield from self.derive(families)

    def derive(self, families: Iterable[Metric]) -> list[Metric]:
        """TorchServe's series from Weir's ``families``."""
        requests: Series = defaultdict(float)
        latency: Series = defaultdict(float)
        queued: Series = defaultdict(float)
        responses: dict[str, float] = defaultdict(float)
        gpus: dict[str, dict[str, float]] = defaultdict(dict)
        for family in families:
            for sample in family.samples:
                name, labels, value = sample.name, sample.labels, sample.value
                if name in _REQUEST_SAMPLES:
                    requests[labels["model"], labels["version"]] += value
                elif name == _LATENCY_SAMPLE:
                    latency[labels["model"], labels["version"]] += value
                elif name == _QUEUE_SAMPLE:
                    queued[labels["model"], labels["version"]] += value
                elif name == _RESPONSES_SAMPLE:
                    responses[labels["status_class"]] += value
                elif name.startswith("nv_gpu_") and names.GPU_UUID in labels:
                    gpus[labels[names.GPU_UUID]][name] = value
        host = {"Level": "Host", "Hostname": self.hostname}
        return [
            self._model_counter(REQUESTS, "Inference requests answered", requests),
            self._model_counter(LATENCY, "Summed latency of requests answered", latency),
            self._model_counter(QUEUE_LATENCY, "Summed time requests queued", queued),
            *_response_counters(responses, host),
            *self.host.families(host),
            *_gpu_gauges(gpus, host),
        ]

    def _model_counter(self, name: str, text: str, series: Series) -> Metric:
        # The samples keep TorchServe's names, _total or not (the metrics port's HELP and
        # TYPE lines too: gateway.metrics_server.UNSUFFIXED_COUNTERS).
        metric = Metric(name.removesuffix("_total"), f"{text} (TorchServe's name)", "counter")
        for (model, version), value in sorted(series.items()):
            labels = {
                "model_name": model,
                "model_version": self.ts_version(model, version),
                "hostname": self.hostname,
            }
            metric.add_sample(name, labels, value)
        return metric


def _response_counters(responses: dict[str, float], host: dict[str, str]) -> list[Metric]:
    counters = []
    for name, classes in _RESPONSE_COUNTERS:
        metric = Metric(name, f"HTTP responses {name[8:]} (TorchServe's name)", "counter")
        metric.add_sample(name, host, sum(responses.get(c, 0.0) for c in classes))
        counters.append(metric)
    return counters


def _gpu_gauges(gpus: dict[str, dict[str, float]], host: dict[str, str]) -> list[Metric]:
    utilization = Metric("GPUUtilization", "GPU utilization, percent", "gauge")
    used = Metric("GPUMemoryUsed", "GPU memory used, megabytes", "gauge")
    used_share = Metric("GPUMemoryUtilization", "GPU memory used, percent", "gauge")
    for uuid, sample in sorted(gpus.items()):
        labels = {"Level": host["Level"], "DeviceId": uuid, "Hostname": host["Hostname"]}
        if "nv_gpu_utilization" in sample:
            utilization.add_sample(utilization.name, labels, sample["nv_gpu_utilization"] * 100)
        if "nv_gpu_memory_used_bytes" in sample:
            used_bytes = sample["nv_gpu_memory_used_bytes"]
            used.add_sample(used.name, labels, used_bytes / _MIB)
            total = sample.get("nv_gpu_memory_total_bytes", 0.0)
            if total:
                used_share.add_sample(used_share.name, labels, used_bytes / total * 100)
    return [utilization, used, used_share]


class StoreVersions:
    """Weir's version of a model of the store, as its TorchServe version string.

    Read from the store's records once per registration change (the scrape's thread only).
    A model or version the store does not know keeps Weir's version.
    """

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._generation = -1
        self._known: dict[tuple[str, str], str] = {}

    def __call__(self, model: str, version: str) -> str:
        with self._lock:
            generation = self.store.generation()
            if generation != self._generation:
                self._generation = generation
                self._known = {}
            found = self._known.get((model, version))
            if found is None:
                try:
                    found = self.store.ts_version_of(model, version)
                except StoreError:
                    found = version
                self._known[(model, version)] = found
            return found


def with_torchserve_names(inner: CollectorRegistry, store: ModelStore) -> CollectorRegistry:
    """A registry that serves ``inner``'s families and TorchServe's names beside them."""
    outer = CollectorRegistry(support_collectors_without_names=True)  # for name[]
    outer.register(TorchServeNames(inner, StoreVersions(store)))
    return outer
