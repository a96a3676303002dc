"""The inference fast path: ``POST .../infer`` served straight from ASGI.

Most infer requests never reach ASGI: the HTTP protocol answers them itself
(:mod:`gateway.direct_infer`). Those it hands on (an escaped path, ``Expect:
100-continue``, a request pipelined behind another) skip FastAPI's router, dependency
injection and middleware stack here. Everything
else (health, metadata, statistics, OpenAPI) still goes to the FastAPI app, which also
describes the infer route. Authentication, error shapes and metrics are the same on both.
"""

from __future__ import annotations

import logging
import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import Scope as TokenScope
from gateway.auth import check_token
from gateway.errors import error_response
from gateway.inference import run_infer
from gateway.state import gateway_state
from weir.errors import WeirError

logger = logging.getLogger(__name__)

INFER_PATH = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")


class InferFastPath:
    """An ASGI app that serves inference itself and hands every other request on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = INFER_PATH.match(scope["path"])
            if match:
                response = await self._infer(Request(scope, receive), match)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _infer(self, request: Request, match: re.Match[str]) -> Response:
        try:
            check_token(request, TokenScope.INFERENCE)
            return await run_infer(
                gateway_state(request), request, match["model"], match["version"]
            )
        except WeirError as exc:
            return error_response(exc.message, exc.http_status, exc.headers)
        except Exception:
            logger.exception("inference failed")
            return error_response("internal error in the gateway", 500, {})
