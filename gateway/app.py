"""The gateway application: lifespan-owned resources, routes, errors in the KServe shape."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from gateway.mesh import MeshClient
from gateway.routes import router
from gateway.state import STATE_KEY, GatewayState
from weir import __version__
from weir.connection import connect
from weir.errors import WeirError
from weir.repository import Repository
from weir.settings import GatewaySettings

logger = logging.getLogger(__name__)


def create_app(settings: GatewaySettings) -> FastAPI:
    """A gateway app for ``settings``; its resources live as long as its lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, GatewayState]]:
        repository = Repository.load(settings.repository)
        redis = connect(settings.redis_url)
        mesh = MeshClient(redis, settings)
        reader = asyncio.create_task(mesh.read_replies(), name="reply reader")
        logger.info("gateway %s serving %d models", mesh.gateway_id, len(repository.models))
        try:
            yield {STATE_KEY: GatewayState(settings, repository, redis, mesh)}
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await mesh.close()
            await redis.aclose()

    app = FastAPI(title="Weir gateway", version=__version__, lifespan=lifespan)
    app.include_router(router)
    app.add_exception_handler(WeirError, _weir_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    return app


def _error(message: str, status_code: int) -> Response:
    return Response(orjson.dumps({"error": message}), status_code, media_type="application/json")


async def _weir_error(_: Request, exc: Exception) -> Response:
    if not isinstance(exc, WeirError):
        raise exc
    return _error(exc.message, exc.http_status)


async def _http_error(_: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        raise exc
    return _error(str(exc.detail), exc.status_code)


async def _validation_error(_: Request, exc: Exception) -> Response:
    return _error(f"invalid request: {exc}", 400)
