"""Triton's trace extension over HTTP: ``/v2/trace/setting`` and a model's own.

``tritonclient.http``'s ``get_trace_settings`` and ``update_trace_settings`` work
unmodified; what the settings do is :mod:`gateway.tracing`'s. Both take the management
token when one is set.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response

from gateway.auth import management_scope
from gateway.repository_routes import json_body
from gateway.state import GatewayState, gateway_state
from gateway.tracing import Tracer
from weir.errors import Unavailable

router = APIRouter()
MANAGEMENT = [Depends(management_scope)]


@router.get("/v2/trace/setting", dependencies=MANAGEMENT)
async def get_trace_settings(request: Request) -> Response:
    return _json(await settings_of(gateway_state(request), None))


@router.post("/v2/trace/setting", dependencies=MANAGEMENT)
async def update_trace_settings(request: Request) -> Response:
    return _json(await change(gateway_state(request), None, await json_body(request)))


@router.get("/v2/models/{model}/trace/setting", dependencies=MANAGEMENT)
async def get_model_trace_settings(request: Request, model: str) -> Response:
    return _json(await settings_of(gateway_state(request), model))


@router.post("/v2/models/{model}/trace/setting", dependencies=MANAGEMENT)
async def update_model_trace_settings(request: Request, model: str) -> Response:
    return _json(await change(gateway_state(request), model, await json_body(request)))


async def settings_of(state: GatewayState, model: str | None) -> dict[str, Any]:
    """The trace settings in force (a model's: NotFound for a model not served)."""
    tracer = _tracer(state, model)
    await tracer.refresh()
    return tracer.settings(model).as_json()


async def change(state: GatewayState, model: str | None, values: dict[str, Any]) -> dict[str, Any]:
    """Change the trace settings (a model's own, or the global ones); those now in force."""
    return (await _tracer(state, model).update(model, values)).as_json()


def _tracer(state: GatewayState, model: str | None) -> Tracer:
    if model is not None:
        state.repository.resolve(model)  # NotFound, as Triton, for a model not served
    if state.tracer is None:
        raise Unavailable("the server does not support tracing")
    return state.tracer


def _json(content: object) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
