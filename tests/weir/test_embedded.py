"""``weir up``: the whole mesh from one command, stopped by one Ctrl-C."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from tests.conftest import ROOT, wait_until
from weir.redis_server import free_port


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_weir_up_serves_and_stops_everything_on_ctrl_c(example_repository: Path) -> None:
    port = free_port()
    metrics_port = free_port()
    grpc_port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weir.cli",
            "up",
            "--http-port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--grpc-port",
            str(grpc_port),
            "--repository",
            str(example_repository),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")))  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until(lambda: any("Weir is up" in line for line in lines), 90, "weir up to be ready")
        banner = next(line for line in lines if "Weir is up" in line)
        assert f"http://127.0.0.1:{port}/v2" in banner
        redis_port = int(re.search(r"redis://127\.0\.0\.1:(\d+)", banner).group(1))  # type: ignore[union-attr]
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]
        }
        response = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/tiny_mlp/infer", json=body, timeout=30
        )
        assert response.status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
        assert not port_open(port), "the gateway still listens after weir up exited"
        assert not port_open(grpc_port), "the gateway's gRPC still listens after weir up exited"
        assert not port_open(redis_port), "redis-server still listens after weir up exited"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        reader.join(5)
        process.stdout.close()  # type: ignore[union-attr]
