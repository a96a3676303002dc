"""The API description (``/openapi.json``, ``/docs``), behind the management token.

FastAPI serves these openly by default; they list every route a caller could try, so when
a management token is set they ask for it, as the other management routes do.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse

from gateway.auth import Scope, check_token

OPENAPI_URL = "/openapi.json"


async def _described(request: Request) -> None:
    if request.app.state.weir_management_token:
        check_token(request, Scope.MANAGEMENT)


router = APIRouter(include_in_schema=False, dependencies=[Depends(_described)])


@router.get(OPENAPI_URL)
async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def docs(request: Request) -> Response:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - docs")
