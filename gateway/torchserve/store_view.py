"""TorchServe's describe answer for a model of the store, from its records and the mesh.

``workers`` lists one entry per instance a live worker runs of the version (TorchServe's
workers are processes; Weir's instances run in worker pool processes, so ``pid`` and
``memoryUsage`` are not per instance and are 0). ``jobQueueStatus.pendingRequests`` is the
version's queued count in Redis, ``remainingCapacity`` what its job queue takes more.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from redis.exceptions import RedisError
from starlette.datastructures import Headers

from gateway.state import GatewayState
from gateway.torchserve.inference_routes import Prediction, bodiless_prediction
from weir import names
from weir.torchserve.store import ModelStore, VersionRecord


async def describe_versions(
    state: GatewayState, store: ModelStore, model: str, version: str | None, customized: bool
) -> list[dict[str, Any]]:
    """``GET /models/{model}[/{version}|/all][?customized=true]``: the versions asked for."""
    record = await asyncio.to_thread(store.describe, model)
    if version == "all":
        return [await _describe(state, model, v) for v in record.versions]
    weir_version = store.version_for(model, version)
    (chosen,) = [v for v in record.versions if v.weir_version == weir_version]
    described = await _describe(state, model, chosen)
    if customized:
        described["customizedMetadata"] = await _customized(state, model, chosen)
    return [described]


async def _customized(state: GatewayState, model: str, version: VersionRecord) -> Any:
    """The handler's own description (``describe_handle``), as TorchServe asks for it.

    A request with the header ``describe: True`` and no body, through the version's queue
    like any prediction; its answer is read as JSON (anything else: an empty object).
    """
    asked = Prediction(model, version.ts_version, False, Headers({"describe": "True"}), b"")
    answer = await bodiless_prediction(state, asked)
    try:
        return orjson.loads(answer.content)
    except orjson.JSONDecodeError:
        return {}


async def _describe(state: GatewayState, model: str, version: VersionRecord) -> dict[str, Any]:
    instances = state.catalog.view.instances.get((model, version.weir_version), 0)
    return {
        "modelName": model,
        "modelVersion": version.ts_version,
        "modelUrl": version.url,
        "runtime": version.runtime,
        "minWorkers": version.min_workers,
        "maxWorkers": version.max_workers,
        "batchSize": version.batch_size,
        "maxBatchDelay": version.max_batch_delay_ms,
        "responseTimeout": version.response_timeout_s,
        "startupTimeout": version.startup_timeout_s,
        "clientTimeoutInMills": version.client_timeout_ms,
        "loadedAtStartup": version.loaded_at_startup,
        "isDefault": version.is_default,
        "weirVersion": version.weir_version,
        "workers": [_worker(i) for i in range(instances)],
        "jobQueueStatus": await _job_queue(state, model, version),
    }


def _worker(index: int) -> dict[str, Any]:
    return {
        "id": str(9000 + index),
        "status": "READY",
        "memoryUsage": 0,
        "pid": 0,
        "gpu": False,
        "gpuUsage": "N/A",
    }


async def _job_queue(state: GatewayState, model: str, version: VersionRecord) -> dict[str, int]:
    try:
        raw = await state.redis.get(names.queued_counter(model, version.weir_version))
    except RedisError:
        raw = None
    pending = max(int(raw or 0), 0)
    return {
        "remainingCapacity": max(version.job_queue_size - pending, 0),
        "pendingRequests": pending,
    }
