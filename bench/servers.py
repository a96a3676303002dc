"""The servers under test as child processes: start, wait until ready, ask, stop.

Each runs in its own session with its output in a log file. Stopping sends SIGTERM to the
top process (``weir up`` stops its own children in order; a peer may pick another, see
:meth:`ServerProcess.signal_stop`), then kills, by PID, whatever of the process tree seen
before the signal is still alive.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from weir.redis_server import free_port

logger = logging.getLogger(__name__)

# Both servers run from the checkout's root, where `python -m bench...` and `weir.cli` import.
ROOT = Path(__file__).resolve().parent.parent


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """Status and body of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def http_post(url: str, body: bytes, timeout_s: float = 60.0) -> tuple[int, bytes]:
    """Status and body of a JSON POST."""
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class ServerProcess:
    """One server under test: its command line, port and log file.

    ``env``: the environment's changes for it; ``cwd``: where it runs (the checkout's root
    unless said).
    """

    def __init__(
        self,
        name: str,
        command: list[str],
        port: int,
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        redis_url: str | None = None,
    ) -> None:
        self.name = name
        self.command = command
        self.port = port
        self.log_path = log_path
        self.env = env or {}
        self.cwd = cwd
        self.redis_url = redis_url  # Weir's Redis, whose counters the bench reads
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def infer_url(self, model: str) -> str:
        """Where a KServe v2 JSON body for ``model`` is POSTed."""
        return f"{self.url}/v2/models/{model}/infer"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.process.pid

    def start(self) -> ServerProcess:
        logger.info("starting %s: %s", self.name, " ".join(self.command))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Return once :meth:`is_ready`; RuntimeError if it exits or stalls."""
        deadline = time.monotonic() + timeout_s
        while not self.is_ready():
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited before ready:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout_s} s:\n{self.log_tail()}")
            time.sleep(0.2)
        logger.info("%s is ready on %s", self.name, self.url)

    def is_ready(self) -> bool:
        return http_get(f"{self.url}/v2/health/ready", 2.0)[0] == 200

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        tree = process_tree(self.process.pid)
        self.signal_stop(tree)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop in %s s; killing it", self.name, timeout_s)
        _, alive = psutil.wait_procs(tree, timeout=5)
        for leftover in alive:
            logger.warning("killing leftover %s pid %d", self.name, leftover.pid)
            leftover.kill()
        psutil.wait_procs(alive, timeout=5)
        logger.info("stopped %s", self.name)

    def signal_stop(self, tree: list[psutil.Process]) -> None:
        """Ask the server to stop: SIGTERM to its top process, which stops the rest."""
        del tree  # the top process knows its children
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (children in their own sessions included)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def weir_server(repository: Path, port: int, log_path: Path) -> ServerProcess:
    command = [sys.executable, "-m", "weir.cli", "up", "--http-port", str(port)]
    # gRPC stays on, as users run it, on a free port rather than Triton's 8001.
    command += ["--grpc-port", str(free_port()), "--repository", str(repository)]
    redis_port = free_port()
    command += ["--redis-port", str(redis_port)]
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    return ServerProcess("weir", command, port, log_path, redis_url=redis_url)


def baseline_server(repository: Path, port: int, threads: int, log_path: Path) -> ServerProcess:
    command = [sys.executable, "-m", "bench.baseline_app", "--repository", str(repository)]
    options = ["--port", str(port), "--torch-threads", str(threads)]
    return ServerProcess("baseline", [*command, *options], port, log_path)


def batch_counts(server: ServerProcess, model: str) -> tuple[int, int]:
    """Weir's (inference_count, execution_count) for ``model``, over all its versions."""
    status, body = http_get(f"{server.url}/v2/models/{model}/stats")
    if status != 200:
        raise RuntimeError(f"GET stats for {model} answered {status}: {body[:200]!r}")
    stats: list[dict[str, Any]] = json.loads(body)["model_stats"]
    return (
        sum(int(s["inference_count"]) for s in stats),
        sum(int(s["execution_count"]) for s in stats),
    )
