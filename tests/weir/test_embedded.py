"""``weir up``: the whole mesh from one command, stopped by one Ctrl-C."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from tests.conftest import ROOT, wait_until
from tests.weir_up import port_open, services, weir_up
from weir.redis_server import free_port
from weir.up_plan import PLAN_ENV


def test_weir_up_serves_and_stops_everything_on_ctrl_c(example_repository: Path) -> None:
    port = free_port()
    metrics_port = free_port()
    grpc_port = free_port()
    args = ["--http-port", str(port), "--metrics-port", str(metrics_port)]
    args += ["--grpc-port", str(grpc_port), "--repository", str(example_repository)]
    with weir_up(*args) as up:
        banner = up.banner
        assert f"http://127.0.0.1:{port}/v2" in banner
        redis_port = int(re.search(r"redis://127\.0\.0\.1:(\d+)", banner).group(1))  # type: ignore[union-attr]
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]
        }
        response = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/tiny_mlp/infer", json=body, timeout=30
        )
        assert response.status_code == 200
        # Settings read, weir up became its supervisor: same pid, no pydantic, no plan passed on.
        supervisor = psutil.Process(up.process.pid)
        assert supervisor.cmdline()[1:] == ["-m", "weir.embedded"]
        assert not [m.path for m in supervisor.memory_maps() if "pydantic" in m.path]
        (gateway,) = services(up.process.pid, "gateway")
        assert PLAN_ENV not in gateway.environ()
        assert gateway.environ()["WEIR_REPOSITORY"] == str(example_repository.resolve())
        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(60) == 0
        assert not port_open(port), "the gateway still listens after weir up exited"
        assert not port_open(grpc_port), "the gateway's gRPC still listens after weir up exited"
        assert not port_open(redis_port), "redis-server still listens after weir up exited"


def test_weir_up_starts_a_service_that_dies_again(tiny_repository: Path) -> None:
    port = free_port()
    args = ["--http-port", str(port), "--metrics-port", "0", "--grpc-port", "0"]
    args += ["--repository", str(tiny_repository)]
    with weir_up(*args) as up:
        (worker,) = services(up.process.pid, "worker")
        worker.kill()
        wait_until(
            lambda: [p.pid for p in services(up.process.pid, "worker")] not in ([], [worker.pid]),
            30,
            "a new worker process",
        )
        wait_until(lambda: infers(port), 90, "the mesh to serve again")
        assert up.process.poll() is None  # weir up itself kept running


def infers(port: int) -> bool:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]
    }
    try:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/tiny_mlp/infer", json=body, timeout=5
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def test_a_start_that_fails_leaves_nothing_running(tiny_repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port, redis_port = taken.getsockname()[1], free_port()
        args = ["--http-port", str(port), "--metrics-port", "0", "--grpc-port", "0"]
        args += ["--redis-port", str(redis_port), "--repository", str(tiny_repository)]
        command = [sys.executable, "-m", "weir.cli", "up", *args]
        up = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
        try:
            wait_until(lambda: services(up.pid, "worker") != [], 60, "the services to start")
            started = psutil.Process(up.pid).children(recursive=True)
            # The gateway cannot bind the port, so the mesh never becomes ready.
            assert up.wait(120) != 0
        finally:
            if up.poll() is None:
                up.kill()
        gone = psutil.wait_procs(started, timeout=30)[1]
        assert not gone, f"still running after weir up failed: {[p.cmdline() for p in gone]}"
        assert not port_open(redis_port), "redis-server still listens after weir up failed"
