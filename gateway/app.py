"""The gateway application: lifespan-owned resources, routes, errors in the KServe shape.

The lifespan also runs the gRPC endpoint (:mod:`gateway.grpc_server`) on the same state.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from starlette.exceptions import HTTPException

from gateway.catalog import Catalog
from gateway.control import ControlLoop
from gateway.docs_routes import router as docs_router
from gateway.errors import error_response
from gateway.exporter import MeshCollector, MetricsServer
from gateway.generate import router as generate_router
from gateway.logging_routes import router as logging_router
from gateway.mesh import MeshClient
from gateway.metrics import RequestMetrics
from gateway.metrics_server import ScrapeLimits
from gateway.reply_streams import ReplyStreams
from gateway.repository_routes import router as repository_router
from gateway.response_cache import CacheCounts, answer_cache
from gateway.routes import router
from gateway.shared_memory import SharedMemoryRegistry
from gateway.shared_memory_routes import router as shared_memory_router
from gateway.state import STATE_KEY, GatewayState
from gateway.torchserve import api_description
from gateway.torchserve.front import TorchServeFront
from gateway.torchserve.inference_routes import router as torchserve_inference_router
from gateway.torchserve.management_routes import router as torchserve_management_router
from gateway.torchserve.metrics import with_torchserve_names
from gateway.trace_routes import router as trace_router
from gateway.tracing import Tracer, TraceSettings
from weir import __version__
from weir.control.mode import ControlMode
from weir.errors import WeirError
from weir.log_settings import LogControl
from weir.redis_io.connection import connect
from weir.repository import Repository
from weir.service import TaskSet
from weir.settings import GatewaySettings
from weir.torchserve.download import Downloads
from weir.torchserve.store import ModelStore

if TYPE_CHECKING:
    from gateway.grpc_server import GrpcServer

logger = logging.getLogger(__name__)


def _flush_metrics(tasks: TaskSet, metrics: RequestMetrics, settings: GatewaySettings) -> None:
    """A process of a multi-process gateway hands its request metrics on every flush_s."""
    if metrics.shared:
        tasks.spawn(metrics.flush_every(settings.metrics_flush_s), "metrics flush")


def create_app(
    settings: GatewaySettings,
    serve_metrics: bool = True,
    drain_hooks: list[Callable[[], None]] | None = None,
) -> FastAPI:
    """A gateway app for ``settings``; its resources live as long as its lifespan.

    With ``serve_metrics`` the app serves its own metrics endpoint; a multi-process gateway
    serves one for all its processes from the parent instead. With a ``grpc_port`` the
    lifespan also serves gRPC, and adds to ``drain_hooks`` what begins its drain, for the
    server to call when it stops taking HTTP connections.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, GatewayState]]:
        redis = connect(settings.redis_url, retries=settings.redis_retries)
        catalog = Catalog(redis, _startup_repository(settings))
        control = ControlLoop(settings, redis, catalog)
        await control.start()
        mesh = MeshClient(redis, settings, catalog)
        control.observers.append(mesh.answer_failed_loads)
        reply_streams = ReplyStreams(redis, mesh.gateway_id, settings.heartbeat_ttl_s)
        await reply_streams.start()
        # Collectors without names too: a scrape asking for name[] reaches each of them.
        registry = CollectorRegistry(support_collectors_without_names=True)
        store = _model_store(settings)
        # Kept as plain numbers, which this process's registry reads when it is the one
        # scraped; a process of a multi-process gateway hands them to prometheus-client's
        # shared files every metrics_flush_s.
        # Serving TorchServe's APIs, it counts responses too (TorchServe's Requests2XX...).
        metrics = RequestMetrics(registry, serve_metrics, count_responses=store is not None)
        exporter = None
        if serve_metrics and settings.metrics_port:
            follow = settings.model_control_mode is not ControlMode.NONE
            registry.register(MeshCollector(settings.redis_url, catalog, follow))
            scraped = registry if store is None else with_torchserve_names(registry, store)
            limits = ScrapeLimits.of(settings)
            exporter = MetricsServer(scraped, settings.host, settings.metrics_port, limits)
        tasks = TaskSet()
        tasks.spawn(mesh.read_replies(), "reply reader")
        tasks.spawn(reply_streams.run(), "reply streams")
        tasks.spawn(control.run(), "model control")
        _flush_metrics(tasks, metrics, settings)
        logger.info("gateway %s serving %d models", mesh.gateway_id, len(catalog.models))
        if settings.inference_token is None:
            ports = f"{settings.http_port}"
            if settings.grpc_port:
                ports += f" or gRPC's {settings.grpc_port}"
            logger.warning(
                "no inference token is set (WEIR_GATEWAY_INFERENCE_TOKEN): anyone who can "
                "reach port %s can run inference",
                ports,
            )
        shm = SharedMemoryRegistry(
            settings.shared_memory_max_regions, settings.shared_memory_max_region_bytes
        )
        front = TorchServeFront(store)
        cache = answer_cache(
            settings.response_cache_bytes,
            settings.response_cache_redis_url,
            settings.response_cache_timeout_s,
        )
        counts = CacheCounts(redis)
        tasks.spawn(counts.run(), "response cache statistics")
        log = LogControl(redis, settings.log_level, settings.log_settings_refresh_s)
        tasks.spawn(log.run(), "log settings")
        tracer = _tracer(settings, redis)
        tasks.spawn(tracer.run(), "trace settings")
        state = GatewayState(
            settings,
            catalog,
            redis,
            mesh,
            metrics,
            shm,
            control,
            front,
            cache=cache,
            cache_counts=counts,
            log=log,
            tracer=tracer,
        )
        grpc_server = None
        # As every service after its startup (weir.service): what lives as long as the
        # gateway is kept out of the collector's full collections.
        gc.freeze()
        try:
            ts_grpc = settings.ts_grpc_inference_port or settings.ts_grpc_management_port
            if settings.grpc_port or (store is not None and ts_grpc):
                grpc_server = await _start_grpc(state)
                if drain_hooks is not None:
                    drain_hooks.append(grpc_server.drain)
            yield {STATE_KEY: state}
        finally:
            if grpc_server is not None:
                await grpc_server.stop()
            if exporter is not None:
                exporter.close()
            await front.close()
            control.stop()
            # Tasks first: the reply-streams task would make the stream close() deletes again.
            await tasks.cancel_all(settings.shutdown_grace_s)
            await counts.flush()
            tracer.close()
            if cache is not None:
                await cache.close()
            await mesh.close()
            await reply_streams.stop()
            await redis.aclose()
            shm.close()

    app = FastAPI(
        title="Weir gateway",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    # When a management token is set the API description takes it (gateway.docs_routes).
    app.state.weir_management_token = settings.management_token is not None
    app.include_router(docs_router)
    app.include_router(router)
    app.include_router(generate_router)
    app.include_router(shared_memory_router)
    app.include_router(repository_router)
    app.include_router(logging_router)
    app.include_router(trace_router)
    app.include_router(torchserve_inference_router)
    app.include_router(torchserve_management_router)
    app.include_router(api_description.inference_router)
    app.include_router(api_description.management_router)
    app.add_exception_handler(WeirError, _weir_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    return app


def _tracer(settings: GatewaySettings, redis: Redis) -> Tracer:
    base = TraceSettings(
        settings.trace_file,
        (settings.trace_level,),
        settings.trace_rate,
        settings.trace_count,
        settings.trace_log_frequency,
    )
    return Tracer(redis, base, settings.processes, settings.log_settings_refresh_s)


def _model_store(settings: GatewaySettings) -> ModelStore | None:
    if settings.model_store is None:
        return None
    downloads = Downloads.of(
        settings.ts_allowed_urls, settings.ts_max_download_bytes, settings.ts_download_timeout_s
    )
    return ModelStore(settings.model_store, settings.repository, downloads)


def _startup_repository(settings: GatewaySettings) -> Repository:
    """Mode none: the repository's files; a control mode: nothing until the desired state."""
    if settings.model_control_mode is ControlMode.NONE:
        return Repository.load(settings.repository, settings.completion)
    return Repository(settings.repository.resolve(), {})


async def _start_grpc(state: GatewayState) -> GrpcServer:
    # grpcio and tritonclient's messages load only in a gateway that serves gRPC.
    from gateway.grpc_server import GrpcServer

    server = GrpcServer(state)
    await server.start()
    return server


async def _weir_error(_: Request, exc: Exception) -> Response:
    if not isinstance(exc, WeirError):
        raise exc
    return error_response(exc.message, exc.http_status, exc.headers)


async def _http_error(_: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        raise exc
    return error_response(str(exc.detail), exc.status_code)


async def _validation_error(_: Request, exc: Exception) -> Response:
    return error_response(f"invalid request: {exc}", 400)
