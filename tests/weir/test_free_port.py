"""free_port hands out loopback ports that the kernel never picks as a connection's source."""

from __future__ import annotations

import itertools
import socket

import pytest

from weir import redis_server
from weir.redis_server import LOW_PORT, _ephemeral_start, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(LOW_PORT <= port < _ephemeral_start() for port in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        used = taken.getsockname()[1]
        # The next candidate is the port in use: the one after it is handed out instead.
        monkeypatch.setattr(redis_server, "_turn", itertools.count(used - LOW_PORT))
        assert free_port() == used + 1
