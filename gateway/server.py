"""Runs the gateway under uvicorn (uvloop and httptools when installed)."""

from __future__ import annotations

import math

import uvicorn

from gateway.app import create_app
from weir.settings import GatewaySettings


def serve(settings: GatewaySettings) -> None:
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.http_port,
        loop="auto",
        http="auto",
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
    )
    uvicorn.Server(config).run()
