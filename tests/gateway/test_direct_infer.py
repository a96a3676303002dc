"""``POST .../infer`` answered by the gateway's HTTP protocol itself (gateway.direct_infer).

Spoken over raw sockets to the running mesh, so what is on the wire is what is checked:
pipelining across both paths, bodies in pieces and chunked, HTTP/1.0, ``Expect``, a body
over the limit refused from its head, escapes and queries. Tokens, compression, cancelling
and the hostile-client limits are tested where they are, over HTTP, which now takes it.
"""

from __future__ import annotations

import socket
from types import ModuleType
from urllib.parse import urlsplit

import numpy as np
import orjson
import pytest
import torch

from tests.conftest import Mesh

ROWS = np.random.default_rng(11).standard_normal((1, 64)).astype(np.float32)
BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": ROWS.tolist()}]}
)
INFER = b"/v2/models/tiny_mlp/infer"


def connect(mesh: Mesh) -> socket.socket:
    address = urlsplit(mesh.url)
    return socket.create_connection((address.hostname, address.port), timeout=30)


def post(
    path: bytes = INFER, body: bytes = BODY, extra: bytes = b"", version: bytes = b"1.1"
) -> bytes:
    return (
        b"POST %s HTTP/%s\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (path, version, len(body), extra, body)
    )


class Responses:
    """Reads HTTP/1.1 responses (content-length framed) off one socket, in order."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def next(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        size = int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            self._read()
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return status, headers, body

    def closed(self) -> bool:
        return self.sock.recv(1) == b""

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"connection closed; had {self.buffer[:200]!r}"
        self.buffer += chunk


def expected(build_models: ModuleType) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(ROWS)).numpy()


def outputs(body: bytes) -> np.ndarray:
    (output,) = orjson.loads(body)["outputs"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def test_an_answer_has_kserves_shape_and_stays_keep_alive(
    mesh: Mesh, build_models: ModuleType
) -> None:
    with connect(mesh) as sock:
        replies = Responses(sock)
        for _ in range(3):
            sock.sendall(post())
            status, headers, body = replies.next()
            assert status == 200
            assert headers["content-type"] == "application/json"
            assert "connection" not in headers and "date" in headers
            np.testing.assert_allclose(outputs(body), expected(build_models), rtol=1e-5)


def test_pipelined_requests_are_answered_in_order_across_both_paths(
    mesh: Mesh, build_models: ModuleType
) -> None:
    unknown = post(b"/v2/models/missing/infer")
    health = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(mesh) as sock:
        sock.sendall(
            post() + health + post() + unknown + post(b"/v2/models/tiny_mlp/versions/1/infer")
        )
        replies = Responses(sock)
        statuses = [replies.next() for _ in range(5)]
    assert [s for s, _, _ in statuses] == [200, 200, 200, 404, 200]
    assert orjson.loads(statuses[3][2])["error"].startswith("Request for unknown model")
    for _, _, body in (statuses[0], statuses[2], statuses[4]):
        np.testing.assert_allclose(outputs(body), expected(build_models), rtol=1e-5)


def test_a_body_sent_in_pieces_and_a_chunked_body_are_read_whole(
    mesh: Mesh, build_models: ModuleType
) -> None:
    with connect(mesh) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each piece its own segment
        request = post()
        for start in range(0, len(request), 97):
            sock.sendall(request[start : start + 97])
        chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (BODY[:100], BODY[100:]))
        sock.sendall(
            b"POST "
            + INFER
            + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
            + b"0\r\n\r\n"
        )
        replies = Responses(sock)
        for _ in range(2):
            status, _, body = replies.next()
            assert status == 200
            np.testing.assert_allclose(outputs(body), expected(build_models), rtol=1e-5)


def test_http_1_0_is_answered_and_closed(mesh: Mesh) -> None:
    with connect(mesh) as sock:
        sock.sendall(post(version=b"1.0"))
        replies = Responses(sock)
        status, headers, _ = replies.next()
        assert (status, headers["connection"]) == (200, "close")
        assert replies.closed()


def test_expect_100_continue_gets_its_interim_response(mesh: Mesh) -> None:
    with connect(mesh) as sock:
        head, body = post(extra=b"Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
        sock.sendall(head + b"\r\n\r\n")
        replies = Responses(sock)
        assert replies.next()[0] == 100
        sock.sendall(body)
        assert replies.next()[0] == 200


def test_a_body_declared_over_the_limit_is_a_413_before_it_is_sent(mesh: Mesh) -> None:
    with connect(mesh) as sock:
        sock.sendall(
            b"POST " + INFER + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"
        )
        status, _, body = Responses(sock).next()
    assert status == 413
    assert "exceeds the limit" in orjson.loads(body)["error"]


def test_an_undecodable_body_is_a_400_and_the_connection_serves_on(mesh: Mesh) -> None:
    with connect(mesh) as sock:
        sock.sendall(post(body=b"{not json") + post())
        replies = Responses(sock)
        status, headers, body = replies.next()
        assert (status, headers["content-type"]) == (400, "application/json")
        assert "error" in orjson.loads(body)
        assert replies.next()[0] == 200


@pytest.mark.parametrize("path", [b"/v2/models/tiny%5Fmlp/infer", b"/v2/models/tiny_mlp/infer?x=1"])
def test_escapes_and_queries_are_served_as_the_asgi_path_serves_them(
    mesh: Mesh, path: bytes
) -> None:
    with connect(mesh) as sock:
        sock.sendall(post(path))
        assert Responses(sock).next()[0] == 200
