"""Hostile HTTP clients meet limits before the app: head size and count, slow heads and
bodies, idle kept-alive connections, too many connections; a well-behaved client is served
meanwhile."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import Mesh, private_mesh, wait_until

MAX_CONNECTIONS = 30


@pytest.fixture(scope="module")
def limited(tiny_repository: Path) -> Iterator[Mesh]:
    env = {
        "WEIR_GATEWAY_MAX_HEADER_BYTES": "8192",
        "WEIR_GATEWAY_MAX_HEADERS": "50",
        "WEIR_GATEWAY_HEADER_TIMEOUT_S": "1",
        "WEIR_GATEWAY_BODY_IDLE_TIMEOUT_S": "1",
        "WEIR_GATEWAY_KEEP_ALIVE_TIMEOUT_S": "1",
        "WEIR_GATEWAY_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
    }
    with private_mesh(tiny_repository, env) as mesh:
        yield mesh


def connect(mesh: Mesh) -> socket.socket:
    address = urlsplit(mesh.url)
    sock = socket.create_connection((address.hostname, address.port), timeout=10)
    return sock


def answer(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def served_quickly(mesh: Mesh) -> float:
    started = time.monotonic()
    assert httpx.get(f"{mesh.url}/v2/health/live", timeout=5).status_code == 200
    return time.monotonic() - started


def test_a_huge_header_is_a_431_before_the_app(limited: Mesh) -> None:
    with connect(limited) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert b'"error":"the request head exceeds 8192 bytes"' in reply


def test_too_many_headers_is_a_431(limited: Mesh) -> None:
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(60))
    with connect(limited) as sock:
        sock.sendall(b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        reply = answer(sock)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert b"more than 50 headers" in reply


def test_a_head_that_never_ends_is_a_408_and_others_are_served(limited: Mesh) -> None:
    with connect(limited) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v2/models/tiny_mlp/infer HTTP/1.1\r\n")
        assert served_quickly(limited) < 1.0
        reply = answer(sock)
        waited = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert 0.9 < waited < 5


def test_a_silent_connection_is_closed_with_a_408(limited: Mesh) -> None:
    with connect(limited) as sock:
        assert answer(sock).startswith(b"HTTP/1.1 408 ")


def test_a_body_that_stops_coming_is_dropped(limited: Mesh) -> None:
    with connect(limited) as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /v2/models/tiny_mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        assert served_quickly(limited) < 1.0
        answer(sock)  # closed by the gateway: recv returns b"" (whatever was said before)
        assert time.monotonic() - started < 5


def test_a_kept_alive_connection_serves_again_then_closes_once_idle(limited: Mesh) -> None:
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,64],"datatype":"FP32","data":[%s]}]}' % (
        b",".join([b"0.5"] * 64)
    )
    request = b"POST /v2/models/tiny_mlp/infer HTTP/1.1\r\nHost: x\r\n"
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    with connect(limited) as sock:
        for _ in range(3):  # each answered on the same connection, none closing it
            sock.sendall(request)
            head = sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 "), head[:200]
            assert b"connection: close" not in head.lower()
        idle_from = time.monotonic()
        closed = answer(sock)  # nothing more sent: the gateway closes it after the timeout
        waited = time.monotonic() - idle_from
    assert closed == b""
    assert 0.9 < waited < 3, waited


def test_connections_past_the_cap_get_a_503_and_the_cap_frees_up(limited: Mesh) -> None:
    held = [connect(limited) for _ in range(MAX_CONNECTIONS)]
    try:
        with connect(limited) as extra:
            reply = answer(extra)
        assert reply.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in reply
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: live(limited), 5, "the gateway to serve once the held connections closed")


def live(mesh: Mesh) -> bool:
    try:
        return httpx.get(f"{mesh.url}/v2/health/live", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_silent_grpc_connection_is_closed_after_the_head_timeout(limited: Mesh) -> None:
    host, port = limited.grpc_target.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        started = time.monotonic()
        answer(sock)  # gRPC closes it: no HTTP/2 handshake came
        assert time.monotonic() - started < 5
