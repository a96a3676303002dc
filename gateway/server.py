"""Runs the gateway under uvicorn (uvloop and httptools when installed).

With ``processes`` > 1 the parent binds the HTTP port, forks that many gateway processes,
and serves the metrics of all of them (prometheus-client's multiprocess directory) on the
metrics port; SIGTERM or SIGINT is passed on to every process. By default
(``reuse_port``) each process listens on a socket of its own bound to the port with
``SO_REUSEPORT``, so the kernel spreads connections evenly over the processes by their
addresses; the parent's socket, bound with it but never listening, only holds the port. A
socket shared by every process is drained by whichever process wakes first (its event
loop accepts all that wait), so a burst of connections lands unevenly, one process holding
a score of them for each of another's, and the processes' cores idle unevenly under load.
The price: connections still waiting in a process's own queue when it closes are reset
(Linux 5.14+ moves them to the other processes with ``net.ipv4.tcp_migrate_req=1``).
Each process serves gRPC on the same port, bound with ``SO_REUSEPORT``
(:mod:`gateway.grpc_server`); the parent starts no gRPC, which must not run across a fork.

A process whose parent dies (SIGKILLed, say) is sent SIGTERM by the kernel (Linux's
``PR_SET_PDEATHSIG``) and drains as below, rather than serve on alone, holding the port with
no parent to serve its metrics or pass on signals.

On SIGTERM uvicorn stops accepting connections and lets in-flight requests finish (up to the
grace period), the gRPC server does the same alongside, then the lifespan closes the reply
reader. The process then exits with 0: a drained gateway is a clean exit, not a death by
signal.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import multiprocessing
import os
import resource
import signal
import socket
from collections.abc import Callable, Iterator
from types import FrameType

import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp

from gateway.app import create_app
from gateway.exporter import MeshCollector, MetricsServer
from gateway.fastpath import InferFastPath
from gateway.http_protocol import HttpLimits, protocol_class
from gateway.metrics_server import ScrapeLimits
from gateway.paths import RawPathGuard
from gateway.torchserve.metrics import with_torchserve_names
from gateway.torchserve.ports import CountResponses, ManagementPort
from weir.control.mode import ControlMode
from weir.repository import ModelEntry, Repository
from weir.settings import GatewaySettings
from weir.torchserve.store import ModelStore

logger = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain_hooks: list[Callable[[], None]]) -> None:
        super().__init__(config)
        self.drain_hooks = drain_hooks

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # gRPC stops taking calls when HTTP does, so both drain within one grace period.
        for hook in self.drain_hooks:
            hook()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises the captured signal after shutdown; Weir's services exit 0.
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _server(settings: GatewaySettings, serve_metrics: bool) -> _Server:
    drain_hooks: list[Callable[[], None]] = []
    app = create_app(settings, serve_metrics=serve_metrics, drain_hooks=drain_hooks)
    served: ASGIApp = InferFastPath(app)
    if management_port(settings):
        served = ManagementPort(served, settings.ts_management_port)
    served = RawPathGuard(served)
    if settings.model_store is not None:
        served = CountResponses(served)
    return _Server(_config(settings, served), drain_hooks)


def http_limits(settings: GatewaySettings) -> HttpLimits:
    """The HTTP connections' limits; the connection cap stays below the descriptor limit."""
    connections = settings.max_connections
    if not connections:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        connections = max(soft * 3 // 4, 64)
    return HttpLimits(
        settings.max_header_bytes,
        settings.max_headers,
        settings.header_timeout_s,
        settings.body_idle_timeout_s,
        connections,
    )


def management_port(settings: GatewaySettings) -> int:
    """TorchServe's management port, served with a model store only (0: none)."""
    return settings.ts_management_port if settings.model_store is not None else 0


def _sockets(settings: GatewaySettings, reuse_port: bool = False) -> list[socket.socket]:
    """The HTTP socket, and the management socket when there is one."""
    sockets = [_bind(settings.host, settings.http_port, reuse_port)]
    if management_port(settings):
        sockets.append(_bind(settings.ts_management_host, settings.ts_management_port, reuse_port))
    return sockets


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _own_sockets(held: list[socket.socket]) -> list[socket.socket]:
    """A socket of this process's own for each of the parent's, on its address (port 0 too)."""
    own = []
    for sock in held:
        host, port = sock.getsockname()[:2]
        own.append(_bind(host, port, reuse_port=True))
        sock.close()  # this process's copy of the parent's; the parent keeps the port
    return own


def spreads_connections(settings: GatewaySettings) -> bool:
    """Whether each gateway process listens on its own ``SO_REUSEPORT`` socket."""
    return settings.processes > 1 and settings.reuse_port and hasattr(socket, "SO_REUSEPORT")


def _config(settings: GatewaySettings, app: ASGIApp) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        loop="auto",
        http=protocol_class(http_limits(settings), management_port(settings)),
        log_level=settings.log_level.lower(),
        access_log=False,
        # Nothing in the gateway reads the client's address, so X-Forwarded-* need not be
        # parsed on every request; no Server header, as Triton sends none.
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
        timeout_keep_alive=settings.keep_alive_timeout_s,  # type: ignore[arg-type]  # any number
    )


def serve(settings: GatewaySettings) -> None:
    if settings.processes == 1:
        sockets = _sockets(settings) if management_port(settings) else None
        _server(settings, serve_metrics=True).run(sockets=sockets)
        return
    if MULTIPROCESS_DIR_ENV not in os.environ:
        raise RuntimeError(f"{MULTIPROCESS_DIR_ENV} must be set before prometheus_client loads")
    _serve_processes(settings)


def _serve_processes(settings: GatewaySettings) -> None:
    sockets = _sockets(settings, reuse_port=spreads_connections(settings))
    context = multiprocessing.get_context("fork")
    parent = os.getpid()
    children = [
        context.Process(target=_child, args=(settings, sockets, parent), name=f"gateway-{i}")
        for i in range(settings.processes)
    ]
    for child in children:
        child.start()
    exporter = _parent_metrics(settings)

    def forward(sig: int, _: FrameType | None) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, sig)

    for sig in HANDLED_SIGNALS:
        signal.signal(sig, forward)
    try:
        for child in children:
            child.join()
    finally:
        if exporter is not None:
            exporter.close()
        for sock in sockets:
            sock.close()
    logger.info("gateway processes exited: %s", [c.exitcode for c in children])


def _child(settings: GatewaySettings, sockets: list[socket.socket], parent: int) -> None:
    _exit_with(parent)
    if spreads_connections(settings):
        sockets = _own_sockets(sockets)
    _server(settings, serve_metrics=False).run(sockets=sockets)


PR_SET_PDEATHSIG = 1


def _exit_with(parent: int) -> None:
    """SIGTERM this process when ``parent`` dies (Linux; elsewhere nothing is arranged)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def _startup_models(settings: GatewaySettings) -> Repository | list[ModelEntry]:
    if settings.model_control_mode is not ControlMode.NONE:
        return []  # the collector follows the desired state
    return Repository.load(settings.repository, settings.completion)


def _parent_metrics(settings: GatewaySettings) -> MetricsServer | None:
    if not settings.metrics_port:
        return None
    registry = CollectorRegistry(support_collectors_without_names=True)  # for name[]
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    registry.register(
        MeshCollector(
            settings.redis_url,
            _startup_models(settings),
            follow=settings.model_control_mode is not ControlMode.NONE,
        )
    )
    if settings.model_store is not None:
        store = ModelStore(settings.model_store, settings.repository)
        registry = with_torchserve_names(registry, store)
    return MetricsServer(registry, settings.host, settings.metrics_port, ScrapeLimits.of(settings))
