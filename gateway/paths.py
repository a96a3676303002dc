"""Paths are routed as they arrive: an encoded ``/`` in a name is refused, never decoded.

uvicorn decodes ``%2F`` before routing, so ``/v2/models/tiny_mlp%2Finfer`` would reach the
infer route while a proxy rule written for the raw path (``/v2/models/*/infer``) saw no
match. A request whose raw path holds an encoded slash is a 400 (in TorchServe's shape on
TorchServe's paths), before authentication or routing.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import error_response
from gateway.torchserve.responses import error_response as torchserve_error

ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)
MESSAGE = "an encoded '/' (%2F) is not allowed in a path"


class RawPathGuard:
    """Refuses requests whose raw path encodes a ``/``; hands every other one on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or b""
            if ENCODED_SLASH.search(raw.split(b"?", 1)[0]):
                path: str = scope["path"]
                if path.startswith("/v2"):
                    response = error_response(MESSAGE, 400, {})
                else:
                    response = torchserve_error(400, MESSAGE)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
