"""Loopback ports for servers started on this machine: free ones, and waiting for one to open.

``free_port`` hands out ports below the kernel's ephemeral range: a port from that range can
become the source port of any outgoing connection between the moment it is found free and
the moment its server binds it ("Address already in use"). In turn from a random start, so
one process never hands out the same port twice in a row.

Between the moment a port is found free and the moment its server binds it (a gateway
imports for seconds first), another process could find it free too: test processes run
side by side, and ``weir up`` may be started twice. So each port handed out is reserved for
:data:`RESERVE_S` in a directory every process of this user shares (a file per port, its
age the reservation's, claimed under one lock), and no process hands out a reserved port.
Where that directory cannot be written, ports go unreserved, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOW_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVE_S = 60.0  # long enough for any server to bind the port it was given
MAX_TRIES = 2000  # candidates in turn before any free port will do (about 20 µs each)
_turn = itertools.count(random.randrange(1 << 16))


def reservations() -> Path:
    """The directory of this user's port reservations."""
    return Path(tempfile.gettempdir()) / f"weir-ports-{os.getuid()}"


def free_port() -> int:
    """A loopback TCP port nothing listens on and no process was handed out lately.

    Below the ephemeral range if it can be.
    """
    high = _ephemeral_start()
    span = high - LOW_PORT
    with _reserving() as claim:
        for _ in range(min(max(span, 0), MAX_TRIES)):
            port = LOW_PORT + next(_turn) % span
            if _bindable(port) and claim(port):
                return port
    with socket.socket() as sock:  # no room below the range: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def _reserving() -> Iterator[Callable[[int], bool]]:
    """Under the reservations' lock, a claim for ports.

    ``claim(port)`` is True, and reserves it from now, if no reservation of it is younger
    than :data:`RESERVE_S`.
    """
    folder = reservations()
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        lock = (folder / "lock").open("a")
    except OSError:
        yield lambda _port: True  # nowhere to reserve: the bind check alone
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)

        def claim(port: int) -> bool:
            path = folder / str(port)
            now = time.time()
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime < RESERVE_S:
                    return False
            # An old reservation's file gets a new age; one that cannot be written leaves the
            # port unreserved, still free: better than no port.
            with contextlib.suppress(OSError):
                path.touch()
            return True

        yield claim


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def wait_for_port(
    port: int, timeout_s: float, host: str = "127.0.0.1", alive: Callable[[], bool] | None = None
) -> None:
    """Return once ``host:port`` accepts connections; TimeoutError after ``timeout_s``.

    With ``alive``, TimeoutError as soon as it says the server meant to listen there is gone.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if alive is not None and not alive():
                raise TimeoutError(
                    f"nothing listens on {host}:{port}: its server is gone"
                ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing listens on {host}:{port} after {timeout_s} s"
                ) from None
            time.sleep(0.05)
