"""The KServe v2 HTTP routes, with Triton's model configuration and statistics extensions."""

from __future__ import annotations

import functools
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response

from gateway import health, metadata
from gateway.auth import inference_scope, management_scope
from gateway.inference import run_infer
from gateway.state import gateway_state

router = APIRouter()
INFERENCE = [Depends(inference_scope)]
MANAGEMENT = [Depends(management_scope)]

HEADER_LENGTH = "inference-header-content-length"
JSON = "application/json"


def _json(content: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status_code, media_type=JSON)


@router.get("/v2/health/live")
async def live() -> Response:
    return Response(status_code=200)


@router.get("/v2/health/ready")
async def ready(request: Request) -> Response:
    state = gateway_state(request)
    ready = await health.ready_when(state, functools.partial(health.serves_all, state))
    return Response(status_code=200 if ready else 503)


@router.get("/v2")
async def server_metadata() -> Response:
    return _json(metadata.server_metadata())


@router.get("/v2/models/stats", dependencies=MANAGEMENT)
async def all_model_stats(request: Request) -> Response:
    # Before /v2/models/{model}, as Triton matches it first: every version of every model.
    state = gateway_state(request)
    entries = [(entry, None) for entry in state.repository]
    return _json({"model_stats": await metadata.read_statistics(state.redis, entries)})


@router.get("/v2/models/{model}", dependencies=INFERENCE)
@router.get("/v2/models/{model}/versions/{version}", dependencies=INFERENCE)
async def model_metadata(request: Request, model: str) -> Response:
    version = _path_version(request)
    entry, _ = gateway_state(request).repository.resolve(model, version)
    return _json(metadata.model_metadata(entry, version))


@router.get("/v2/models/{model}/ready", dependencies=INFERENCE)
@router.get("/v2/models/{model}/versions/{version}/ready", dependencies=INFERENCE)
async def model_ready(request: Request, model: str) -> Response:
    version = _path_version(request)
    state = gateway_state(request)
    entry, version = state.repository.resolve(model, version)
    ready = await health.ready_when(
        state, functools.partial(health.serves_model, state, entry, version)
    )
    return Response(status_code=200 if ready else 503)


@router.get("/v2/models/{model}/config", dependencies=INFERENCE)
@router.get("/v2/models/{model}/versions/{version}/config", dependencies=INFERENCE)
async def model_config(request: Request, model: str) -> Response:
    version = _path_version(request)
    entry, _ = gateway_state(request).repository.resolve(model, version)
    return _json(metadata.model_config(entry))


@router.get("/v2/models/{model}/stats", dependencies=MANAGEMENT)
@router.get("/v2/models/{model}/versions/{version}/stats", dependencies=MANAGEMENT)
async def model_stats(request: Request, model: str) -> Response:
    version = _path_version(request)
    state = gateway_state(request)
    entry, _ = state.repository.resolve(model, version)
    stats = await metadata.read_statistics(state.redis, [(entry, version)])
    return _json({"model_stats": stats})


@router.post("/v2/models/{model}/infer", dependencies=INFERENCE)
@router.post("/v2/models/{model}/versions/{version}/infer", dependencies=INFERENCE)
async def infer(request: Request, model: str) -> Response:
    # Served by gateway.fastpath before FastAPI sees it; kept for the OpenAPI description.
    return await run_infer(gateway_state(request), request, model, _path_version(request))


def _path_version(request: Request) -> str | None:
    # Read from the path only: a `version` query parameter must not select a version.
    version = request.path_params.get("version")
    return None if version is None else str(version)
