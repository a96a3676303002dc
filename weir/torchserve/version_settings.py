"""A model version's settings, chosen as TorchServe chooses them, and the config they make.

A setting comes, as in TorchServe, from the request, else the archive's
``model-config.yaml``, else ``config.properties``' ``models=`` entry, else TorchServe's
default (batch size 1, 100 ms delay, 120 s response and startup timeouts). Each source is
read into a :class:`~weir.torchserve.properties.ModelVersionSettings` (None where it does
not say), and :func:`resolve` takes the first that says, layer by layer.

Batching and workers are a model's settings in Weir but a version's in TorchServe: the
first version registered sets them and later versions keep them (:func:`in_force`). The
timeouts are the config's ``response_timeout_s`` and ``load_timeout_s`` parameters, which
the worker enforces.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.config import Backend, InstanceKind
from weir.config_parameters import LOAD_TIMEOUT_S, RESPONSE_TIMEOUT_S
from weir.torchserve import envelope
from weir.torchserve.properties import ModelVersionSettings
from weir.torchserve.records import VersionRecord
from weir.torchserve.store_errors import StoreError

DEFAULT_BATCH_SIZE = 1
DEFAULT_MAX_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120
DEFAULT_STARTUP_TIMEOUT_S = 120
DEFAULT_JOB_QUEUE_SIZE = 100
_DEVICE_KINDS = {"cpu": InstanceKind.CPU, "gpu": InstanceKind.GPU}
# model-config.yaml keys TorchServe's frontend reads, as ModelVersionSettings fields.
_YAML_KEYS = {
    "batchSize": "batch_size",
    "maxBatchDelay": "max_batch_delay_ms",
    "responseTimeout": "response_timeout_s",
    "startupTimeout": "startup_timeout_s",
    "jobQueueSize": "job_queue_size",
    "clientTimeoutInMills": "client_timeout_ms",
    "minWorkers": "min_workers",
    "maxWorkers": "max_workers",
}


@dataclass(frozen=True)
class VersionSettings:
    """The settings in force for a model version, every layer applied."""

    batch_size: int
    max_batch_delay_ms: int
    min_workers: int
    max_workers: int
    response_timeout_s: int
    startup_timeout_s: int
    job_queue_size: int
    client_timeout_ms: int  # 0: none


def requested(
    batch_size: int | None,
    delay_ms: int | None,
    workers: int | None,
    timeout_s: int | None,
    startup_timeout_s: int | None,
) -> ModelVersionSettings:
    """The request's settings, checked.

    Raises:
        StoreError: A setting is below its minimum.
    """
    for label, value, minimum in (
        ("batch_size", batch_size, 1),
        ("max_batch_delay", delay_ms, 0),
        ("initial_workers", workers, 1),
        ("response_timeout", timeout_s, 1),
        ("startup_timeout", startup_timeout_s, 1),
    ):
        if value is not None and value < minimum:
            raise StoreError(f"{label} must be {minimum} or more, not {value}")
    return ModelVersionSettings(
        batch_size=batch_size,
        max_batch_delay_ms=delay_ms,
        min_workers=workers,
        max_workers=workers,
        response_timeout_s=timeout_s,
        startup_timeout_s=startup_timeout_s,
    )


def archive_settings(archive: Path, model_yaml: dict[str, Any]) -> ModelVersionSettings:
    """The frontend settings of an archive's ``model-config.yaml`` TorchServe would use.

    Raises:
        StoreError: A setting is not an integer.
    """
    values: dict[str, Any] = {}
    for key, field_name in _YAML_KEYS.items():
        value = model_yaml.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise StoreError(f"{archive}: model-config.yaml: {key} must be an integer")
        if value > 0:  # TorchServe reads 0 or less as not set
            values[field_name] = value
    low, high = values.get("min_workers"), values.get("max_workers")
    if low is None or high is None or high < low:
        # TorchServe takes the archive's workers only as a valid pair.
        values.pop("min_workers", None)
        values.pop("max_workers", None)
    return ModelVersionSettings(**values)


def device_kind(model_yaml: dict[str, Any]) -> InstanceKind:
    """The instances an archive's ``deviceType`` asks for; none or unknown: Weir decides."""
    device = str(model_yaml.get("deviceType", "")).lower()
    return _DEVICE_KINDS.get(device, InstanceKind.AUTO)


def resolve(layers: tuple[ModelVersionSettings, ...], default_workers: int) -> VersionSettings:
    """Each setting from the first of ``layers`` that says, else TorchServe's default."""

    def pick(name: str, default: int) -> int:
        found = (getattr(layer, name) for layer in layers)
        return next((value for value in found if value is not None), default)

    low = pick("min_workers", default_workers)
    return VersionSettings(
        batch_size=pick("batch_size", DEFAULT_BATCH_SIZE),
        max_batch_delay_ms=pick("max_batch_delay_ms", DEFAULT_MAX_BATCH_DELAY_MS),
        min_workers=low,
        max_workers=max(pick("max_workers", low), low),
        response_timeout_s=pick("response_timeout_s", DEFAULT_RESPONSE_TIMEOUT_S),
        startup_timeout_s=pick("startup_timeout_s", DEFAULT_STARTUP_TIMEOUT_S),
        job_queue_size=pick("job_queue_size", DEFAULT_JOB_QUEUE_SIZE),
        client_timeout_ms=pick("client_timeout_ms", 0),
    )


def in_force(current: VersionRecord, asked: VersionSettings) -> VersionSettings:
    """A model's batching, workers and queue, from a ``current`` version; ``asked``'s timeouts."""
    return VersionSettings(
        current.batch_size,
        current.max_batch_delay_ms,
        current.min_workers,
        current.max_workers,
        asked.response_timeout_s,
        asked.startup_timeout_s,
        current.job_queue_size,
        current.client_timeout_ms,
    )


def model_config(name: str, settings: VersionSettings, kind: InstanceKind) -> dict[str, Any]:
    """The ``config.yaml`` Weir's loader reads for a TorchServe model served so."""
    return {
        "name": name,
        "backend": Backend.TORCHSERVE.value,
        "max_batch_size": settings.batch_size,
        "dynamic_batching": {
            "preferred_batch_size": [settings.batch_size],
            "max_queue_delay_microseconds": settings.max_batch_delay_ms * 1000,
            # TorchServe's job queue: past it a request is refused with a 503; its client
            # timeout: a request not answered within it is answered so (0: none).
            "default_queue_policy": {
                "max_queue_size": settings.job_queue_size,
                "default_timeout_microseconds": settings.client_timeout_ms * 1000,
            },
        },
        "instance_group": [{"count": settings.min_workers, "kind": kind.value}],
        "version_policy": {"all": {}},
        # TorchServe's responseTimeout and startupTimeout, enforced by the worker.
        "parameters": {
            RESPONSE_TIMEOUT_S: str(settings.response_timeout_s),
            LOAD_TIMEOUT_S: str(settings.startup_timeout_s),
        },
        "input": envelope.INPUTS,
        "output": envelope.OUTPUTS,
    }
