"""free_port hands out loopback ports that the kernel never picks as a connection's source,
and that no other process was handed out lately."""

from __future__ import annotations

import itertools
import random
import socket
import subprocess
import sys

import pytest

from weir import ports
from weir.ports import LOW_PORT, _ephemeral_start, free_port


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
        monkeypatch.setattr(ports, "_turn", itertools.count(used - LOW_PORT))
        assert free_port() == used + 1


def test_processes_side_by_side_never_get_the_same_port() -> None:
    # Both start their turn at the same port: without reservations they would hand out the
    # same ports in the same order (each is free until its server binds it).
    script = (
        "import itertools, sys\n"
        "from weir import ports\n"
        "ports._turn = itertools.count(int(sys.argv[1]))\n"
        "print(' '.join(str(ports.free_port()) for _ in range(100)))\n"
    )
    start = str(random.randrange(_ephemeral_start() - LOW_PORT - 200))
    runs = [
        subprocess.Popen([sys.executable, "-c", script, start], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    handed = [set(map(int, run.communicate(timeout=60)[0].split())) for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert len(handed[0]) == len(handed[1]) == 100
    assert not handed[0] & handed[1]


def test_a_reservation_lasts_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    start = random.randrange(_ephemeral_start() - LOW_PORT - 200)
    monkeypatch.setattr(ports, "_turn", itertools.count(start))
    first = free_port()
    monkeypatch.setattr(ports, "_turn", itertools.count(start))
    assert free_port() != first  # reserved: the turn goes on past it
    monkeypatch.setattr(ports, "RESERVE_S", 0.0)
    monkeypatch.setattr(ports, "_turn", itertools.count(start))
    assert free_port() == first  # its reservation is over
