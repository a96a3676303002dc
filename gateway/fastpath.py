"""The inference fast path: ``POST .../infer`` and TorchServe's predictions, straight from ASGI.

Most infer requests never reach ASGI: the HTTP protocol answers them itself
(:mod:`gateway.direct_infer`). Those it hands on (an escaped path, ``Expect:
100-continue``, a request pipelined behind another) skip FastAPI's router, dependency
injection and middleware stack here. So do TorchServe's ``POST``/``PUT``
``/predictions/{m}[/{v}]`` and ``/explanations/...``: FastAPI's stack and its matching of
every route cost a prediction twice what the prediction itself costs the gateway.
Everything else (health, metadata, statistics, management, OpenAPI) still goes to the
FastAPI app, which also describes these routes. Authentication, error shapes and metrics
are the same on both.
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
from gateway.torchserve.inference_routes import guarded_prediction
from weir.errors import WeirError

logger = logging.getLogger(__name__)

INFER_PATH = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
PREDICTION_PATH = re.compile(
    r"^/(?P<kind>predictions|explanations)/(?P<model>[^/]+)(?:/(?P<version>[^/]+))?$"
)


class InferFastPath:
    """An ASGI app that serves inference itself and hands every other request on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT"):
            path = scope["path"]
            match = INFER_PATH.match(path) if scope["method"] == "POST" else None
            if match:
                response = await self._infer(Request(scope, receive), match)
                await response(scope, receive, send)
                return
            match = PREDICTION_PATH.match(path)
            if match:
                explain = match["kind"] == "explanations"
                request = Request(scope, receive)
                response = await guarded_prediction(
                    request, match["model"], match["version"], explain
                )
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
