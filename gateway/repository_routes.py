"""Triton's model repository extension over HTTP, and Weir's traffic weights.

``POST /v2/repository/index``, ``.../models/{m}/load`` and ``.../models/{m}/unload`` as
Triton serves them, so ``tritonclient.http`` works unmodified; ``.../models/{m}/traffic``
sets how requests that name no version are split between versions. All take the management
token when one is set. The work is :mod:`gateway.model_control`'s, shared with gRPC.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response

from gateway import model_control
from gateway.auth import management_scope
from gateway.inference import read_body
from gateway.state import gateway_state
from weir.errors import InvalidInput

router = APIRouter()
MANAGEMENT = [Depends(management_scope)]


@router.post("/v2/repository/index", dependencies=MANAGEMENT)
async def repository_index(request: Request) -> Response:
    body = await json_body(request)
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInput("'ready' must be a boolean")
    models = await model_control.index(gateway_state(request), ready)
    return Response(orjson.dumps(models), media_type="application/json")


@router.post("/v2/repository/models/{model}/load", dependencies=MANAGEMENT)
async def repository_load(request: Request, model: str) -> Response:
    parameters = _parameters(await json_body(request))
    await model_control.load(gateway_state(request), model, parameters)
    return Response(status_code=200)


@router.post("/v2/repository/models/{model}/unload", dependencies=MANAGEMENT)
async def repository_unload(request: Request, model: str) -> Response:
    parameters = _parameters(await json_body(request))
    await model_control.unload(gateway_state(request), model, parameters)
    return Response(status_code=200)


@router.post("/v2/repository/models/{model}/traffic", dependencies=MANAGEMENT)
async def repository_traffic(request: Request, model: str) -> Response:
    body = await json_body(request)
    await model_control.set_weights(gateway_state(request), model, body.get("weights", {}))
    return Response(status_code=200)


async def json_body(request: Request) -> dict[str, Any]:
    raw = await read_body(request, gateway_state(request).settings.body_limit_bytes)
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
    return body


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    return parameters
