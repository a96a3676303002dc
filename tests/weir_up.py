"""``weir up`` as a real subprocess for tests: started, read, and never left running."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import pytest

from tests.conftest import ROOT, wait_until

READY = "Weir is up"


@dataclass
class Up:
    """A running ``weir up`` and the banner it printed when ready."""

    process: subprocess.Popen[str]
    banner: str
    lines: list[str]  # everything it printed so far


@contextmanager
def weir_up(*args: str, logs: bool = False) -> Iterator[Up]:
    """Start ``weir up`` with ``args``; yield once it is ready; kill it if it still runs after.

    ``logs``: its services' logs (their stderr) are read into ``lines`` too.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "weir.cli", "up", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if logs else None,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        ready = lambda: any(READY in line for line in lines)  # noqa: E731
        wait_until(lambda: ready() or process.poll() is not None, 90, "weir up to be ready")
        if not ready():
            pytest.fail(f"weir up exited with status {process.returncode} before it was ready")
        yield Up(process, next(line for line in lines if READY in line), lines)
    finally:
        # SIGINT, as Ctrl-C: weir up stops its children, which hold its stdout open too.
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(5)
        process.stdout.close()  # type: ignore[union-attr]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def services(pid: int, command: str) -> list[psutil.Process]:
    """The children of weir up that run ``weir <command>``."""
    found = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            alive = child.is_running() and child.status() != psutil.STATUS_ZOMBIE
            if alive and command in child.cmdline()[3:4]:
                found.append(child)
    return found
