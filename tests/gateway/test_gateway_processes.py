"""A multi-process gateway spreads its HTTP connections over its processes.

Each gateway process listens on its own ``SO_REUSEPORT`` socket (``WEIR_GATEWAY_REUSE_PORT``,
the default), so the kernel hashes connections over the processes. Over one shared socket
the process that wakes first accepts every connection waiting, and a burst of connections
(a load balancer's pool, a benchmark's) lands on one or two processes while the others
idle. A real gateway of four processes on the session mesh's Redis, real sockets. Its
processes exit with their parent.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import psutil
import pytest

from tests.chaos.helpers import Topology
from tests.conftest import Mesh, http_ready, wait_until
from weir.redis_server import free_port

PROCESSES = 4
CONNECTIONS = 64


def held_connections(
    parent: int, port: int, status: str = psutil.CONN_ESTABLISHED
) -> dict[int, int]:
    """How many sockets on ``port`` in ``status`` each of ``parent``'s children holds."""
    held = {}
    for child in psutil.Process(parent).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            held[child.pid] = sum(
                1
                for c in child.net_connections(kind="tcp")
                if c.status == status and c.laddr and c.laddr.port == port
            )
    return held


def every_process_listens(parent: int, port: int) -> bool:
    listening = held_connections(parent, port, psutil.CONN_LISTEN)
    return len(listening) == PROCESSES and min(listening.values()) > 0


def alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def ask_live(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: weir\r\n\r\n")
    return sock.recv(4096).split(b"\r\n", 1)[0]


@pytest.mark.timeout(90)
def test_a_burst_of_connections_is_spread_over_every_gateway_process(
    mesh: Mesh, tmp_path: Path
) -> None:
    port = free_port()
    topology = Topology(mesh.redis_url, mesh.repository, tmp_path)
    gateway = topology.start(
        "gateway",
        "gateway",
        WEIR_GATEWAY_HTTP_PORT=str(port),
        WEIR_GATEWAY_GRPC_PORT="0",
        WEIR_GATEWAY_METRICS_PORT="0",
        WEIR_GATEWAY_PROCESSES=str(PROCESSES),
    )
    sockets: list[socket.socket] = []
    try:
        wait_until(lambda: http_ready(f"http://127.0.0.1:{port}/v2/health/live"), 60, "live")
        # Live as soon as one process answers: the connections wait for all to listen.
        wait_until(lambda: every_process_listens(gateway.pid, port), 30, "every process")
        baseline = sum(held_connections(gateway.pid, port).values())
        for _ in range(CONNECTIONS):  # opened at once, before any is used
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        wait_until(
            lambda: sum(held_connections(gateway.pid, port).values()) - baseline >= CONNECTIONS,
            30,
            "every connection to be accepted",
        )
        held = held_connections(gateway.pid, port)
        # An even spread is 16 each; hashing four ways leaves a process under 2 about once
        # in a million runs, while a shared socket leaves some with none or one.
        assert len(held) == PROCESSES and min(held.values()) >= 2, held
        assert {ask_live(sock) for sock in sockets} == {b"HTTP/1.1 200 OK"}

        # A parent SIGKILLed leaves no process serving on alone: each is sent SIGTERM.
        children = psutil.Process(gateway.pid).children()
        gateway.kill()
        gateway.wait(10)
        wait_until(lambda: not any(map(alive, children)), 30, "the orphans' exit")
    finally:
        for sock in sockets:
            sock.close()
        topology.stop_all()
