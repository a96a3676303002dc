"""TorchServe's management API on a port of its own, served by the gateway's one app.

The gateway's server listens on the HTTP port and the management port with the same ASGI
app; :class:`ManagementPort` sends what arrives on the management port to the management
routes (under :data:`PREFIX`, which no request on another port can reach) and nothing else
there. :class:`CountResponses` counts each response of both ports by its status, for
TorchServe's ``Requests2XX``, ``Requests4XX`` and ``Requests5XX``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.state import STATE_KEY, GatewayState
from gateway.torchserve.responses import error_response

PREFIX = "/__torchserve_management__"


class ManagementPort:
    """Routes the management port's requests to the management routes only."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.app = app
        self.port = port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            server = scope.get("server")
            on_management = server is not None and server[1] == self.port
            path: str = scope["path"]
            if on_management:
                scope = {**scope, "path": PREFIX + path, "raw_path": None, "root_path": ""}
            elif path.startswith(PREFIX):
                await error_response(
                    404,
                    "Requested resource is not found, please refer to API document.",
                    "ResourceNotFoundException",
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)


class CountResponses:
    """Counts every response the ASGI app sends (``RequestMetrics.responded``).

    Inference answered without ASGI (:mod:`gateway.direct_infer`) is counted where it is
    answered; this counts the rest.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: GatewayState | None = None
        if scope["type"] == "http":
            state = scope.get("state", {}).get(STATE_KEY)
        if state is None or not state.metrics.counts_responses:
            await self.app(scope, receive, send)
            return
        metrics = state.metrics

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                metrics.responded(message["status"])
            await send(message)

        await self.app(scope, receive, counted)
