"""The metrics port's server: behind the management token, cheap and bounded under load.

prometheus-client's own server renders every scrape anew in a new thread, with no limit: a
flood of scrapes held the GIL and slowed inference by seconds. This one renders once for
all the scrapes that wait on that render (and reuses it for ``cache_s``), serves at most
``max_scrapes`` at once (503 past it, at once; past twice that many connections a connection
is closed unanswered), gives a client ``timeout_s`` to send its request, and, when a
management token is set, asks for it (``Authorization: Bearer``; 401 without).

``?name[]=a&name[]=b`` keeps only the samples named (TorchServe's metrics API and
prometheus-client's own server take the same); such a scrape is rendered for itself.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from weir.settings import GatewaySettings

logger = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


@dataclass(frozen=True, slots=True)
class ScrapeLimits:
    """How the metrics port guards itself."""

    token: str | None = None
    cache_s: float = 0.0
    max_scrapes: int = 4
    timeout_s: float = 10.0

    @classmethod
    def of(cls, settings: GatewaySettings) -> ScrapeLimits:
        token = settings.management_token
        return cls(
            None if token is None else token.get_secret_value(),
            settings.metrics_cache_s,
            settings.metrics_max_scrapes,
            settings.header_timeout_s,
        )


# Counters that Triton and TorchServe name without _total. prometheus-client's text format
# writes a counter family's HELP and TYPE lines as <name>_total whatever its samples are
# named; these get their own names back, so a parser types their samples as counters.
UNSUFFIXED_COUNTERS = (
    "nv_energy_consumption",
    "nv_cache_num_hits_per_model",
    "nv_cache_num_misses_per_model",
    "nv_cache_hit_duration_per_model",
    "nv_cache_miss_duration_per_model",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
    "Requests2XX",
    "Requests4XX",
    "Requests5XX",
)


def exposition(registry: Collector) -> bytes:
    """The text format of ``registry``, counters named without ``_total`` named as theirs.

    Those of :data:`UNSUFFIXED_COUNTERS`, and any counter whose first sample is named
    without the suffix (a TorchServe handler's own, say).
    """
    body = generate_latest(registry)
    for name in UNSUFFIXED_COUNTERS:
        if name.encode() in body:
            body = _unsuffixed(body, name.encode())
    if b"_total counter\n" not in body:
        return body
    lines = body.split(b"\n")
    for index, line in enumerate(lines[:-1]):
        if line.startswith(b"# TYPE ") and line.endswith(b"_total counter"):
            _name_as_sampled(lines, index, line[len(b"# TYPE ") : -len(b"_total counter")])
    return b"\n".join(lines)


def _name_as_sampled(lines: list[bytes], index: int, family: bytes) -> None:
    """The HELP and TYPE lines before ``lines[index + 1]`` without ``_total``, if it has none."""
    if not lines[index + 1].startswith((family + b"{", family + b" ")):
        return
    lines[index] = b"# TYPE " + family + b" counter"
    help_line = b"# HELP " + family + b"_total "
    if index and lines[index - 1].startswith(help_line):
        lines[index - 1] = b"# HELP " + family + b" " + lines[index - 1][len(help_line) :]


def _unsuffixed(body: bytes, name: bytes) -> bytes:
    for line in (b"# HELP ", b"# TYPE "):
        body = body.replace(line + name + b"_total ", line + name + b" ")
    return body


class CachedExposition:
    """The registry's exposition, rendered once for every scrape that waited on that render.

    A scrape gets a render that began no earlier than ``cache_s`` before it arrived: with 0,
    never older than the scrape itself, yet a flood of scrapes waiting on one render shares
    it instead of each rendering again.
    """

    def __init__(self, registry: CollectorRegistry, cache_s: float) -> None:
        self.registry = registry
        self.cache_s = cache_s
        self.lock = threading.Lock()
        self.body = b""
        self.began_at = -float("inf")

    def get(self, names: list[str] | None = None) -> bytes:
        """The exposition; with ``names``, of the samples so named only."""
        if names:
            with self.lock:
                return exposition(self.registry.restricted_registry(names))
        arrived = time.monotonic()
        with self.lock:
            if self.began_at < arrived - self.cache_s:
                began = time.monotonic()
                self.body = exposition(self.registry)
                self.began_at = began
            return self.body


class MetricsApp:
    """The WSGI app of the metrics port."""

    def __init__(self, registry: CollectorRegistry, limits: ScrapeLimits) -> None:
        self.limits = limits
        self.exposition = CachedExposition(registry, limits.cache_s)
        self.slots = threading.BoundedSemaphore(limits.max_scrapes)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") not in ("/", "/metrics"):
            return _plain(start_response, "404 Not Found", b"not found\n")
        if not self._authorized(environ.get("HTTP_AUTHORIZATION", "")):
            headers = [("WWW-Authenticate", "Bearer")]
            denied = b"a bearer token is needed\n"
            return _plain(start_response, "401 Unauthorized", denied, headers)
        if not self.slots.acquire(blocking=False):
            headers = [("Retry-After", "1")]
            return _plain(start_response, "503 Service Unavailable", b"too many scrapes\n", headers)
        try:
            body = self.exposition.get(parse_qs(environ.get("QUERY_STRING", "")).get("name[]"))
        finally:
            self.slots.release()
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
        return [body]

    def _authorized(self, authorization: str) -> bool:
        if self.limits.token is None:
            return True
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.encode(), self.limits.token.encode()
        )


def _plain(
    start_response: StartResponse,
    status: str,
    body: bytes,
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain"), *(headers or [])])
    return [body]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per connection, up to ``max_threads``.

    Past them a connection is closed at once, before a thread or any parsing costs the
    gateway's interpreter anything.
    """

    daemon_threads = True
    max_threads = 8

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.active = threading.BoundedSemaphore(self.max_threads)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.active.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.active.release()


def _quiet_handler(timeout_s: float) -> type[WSGIRequestHandler]:
    class Handler(WSGIRequestHandler):
        timeout = timeout_s  # a client that sends nothing loses its thread after this

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, limits: ScrapeLimits
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``host:port`` from a daemon thread."""
    server_class = type(
        "MetricsHttpServer", (_ThreadingServer,), {"max_threads": 2 * limits.max_scrapes}
    )
    server: WSGIServer = make_server(
        host,
        port,
        MetricsApp(registry, limits),
        server_class,
        handler_class=_quiet_handler(limits.timeout_s),
    )
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
