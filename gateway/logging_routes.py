"""Triton's logging extension over HTTP: ``GET`` and ``POST /v2/logging``.

``tritonclient.http``'s ``get_log_settings`` and ``update_log_settings`` work unmodified. A
change reaches every service of the mesh (:mod:`weir.log_settings`); both take the
management token when one is set.
"""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Depends, Request, Response

from gateway.auth import management_scope
from gateway.repository_routes import json_body
from gateway.state import gateway_state
from weir.errors import Unavailable

router = APIRouter()
MANAGEMENT = [Depends(management_scope)]


@router.get("/v2/logging", dependencies=MANAGEMENT)
async def get_log_settings(request: Request) -> Response:
    log = gateway_state(request).log
    if log is None:
        raise Unavailable("the server does not support dynamic logging")
    return _json((await log.read()).as_json())


@router.post("/v2/logging", dependencies=MANAGEMENT)
async def update_log_settings(request: Request) -> Response:
    log = gateway_state(request).log
    if log is None:
        raise Unavailable("the server does not support dynamic logging")
    settings = await log.update(await json_body(request))
    return _json(settings.as_json())


def _json(content: object) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
