"""TorchServe's API description: ``OPTIONS /`` and ``GET /api-description`` on its ports.

On the HTTP port it is the gateway's OpenAPI description (what ``/openapi.json`` serves:
KServe v2 and TorchServe's inference API alike). On the management port it lists the
management API's paths and methods, OpenAPI-shaped. Both ask for the management token when
one is set, as ``/openapi.json`` does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from gateway.auth import Scope, check_token
from gateway.torchserve import management_routes
from gateway.torchserve.ports import PREFIX
from gateway.torchserve.responses import weir_error_response
from weir import __version__
from weir.errors import WeirError

inference_router = APIRouter(include_in_schema=False)
management_router = APIRouter(prefix=PREFIX, include_in_schema=False)


@inference_router.api_route("/", methods=["OPTIONS"])
@inference_router.get("/api-description")
async def inference_description(request: Request) -> Response:
    return _guarded(request, lambda: request.app.openapi())


@management_router.api_route("/", methods=["OPTIONS"])
@management_router.get("/api-description")
async def management_description(request: Request) -> Response:
    routes = [r for r in management_routes.router.routes if isinstance(r, APIRoute)]
    return _guarded(request, lambda: describe(routes))


def _guarded(request: Request, document: Any) -> Response:
    try:
        if request.app.state.weir_management_token:
            check_token(request, Scope.MANAGEMENT)
    except WeirError as exc:
        return weir_error_response(exc)
    return JSONResponse(document())


def describe(routes: list[APIRoute]) -> dict[str, Any]:
    """An OpenAPI document of ``routes``: each path, its methods and their summaries."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        path = route.path.removeprefix(PREFIX)
        summary = (route.endpoint.__doc__ or route.name).strip().splitlines()[0]
        for method in sorted(route.methods or ()):
            paths.setdefault(path, {})[method.lower()] = {
                "operationId": f"{route.name}_{method.lower()}",
                "summary": summary,
            }
    info = {"title": "Weir: TorchServe's management API", "version": __version__}
    return {"openapi": "3.0.1", "info": info, "paths": paths}
