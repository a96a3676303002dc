"""Helpers for the chaos tests: a private repository, services as processes, a load loop."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from tests.conftest import ROOT, http_ready, wait_until

SERVICES = {
    "gateway": ["gateway"],
    "batcher": ["batcher"],
    "worker": ["worker", "--pool", "cpu"],
    "gpu-worker": ["worker", "--pool", "gpu"],
}


def private_repository(source: Path, target: Path, models: list[str]) -> Path:
    """A repository with only ``models``, copied from ``source`` (weights included)."""
    for model in models:
        shutil.copytree(source / model, target / model)
    return target


@dataclass
class Topology:
    """Mesh services started one process at a time, against one Redis."""

    redis_url: str
    repository: Path
    log_dir: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    by_name: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, service: str, name: str, **env: str) -> subprocess.Popen[bytes]:
        environment = {
            **os.environ,
            "WEIR_REDIS_URL": self.redis_url,
            "WEIR_REPOSITORY": str(self.repository),
            "WEIR_GATEWAY_HOST": "127.0.0.1",
            "WEIR_WORKER_TORCH_THREADS": "1",
            "WEIR_GATEWAY_METRICS_PORT": "0",
            "WEIR_GATEWAY_GRPC_PORT": "0",
            **self.env_extra,
            **env,
        }
        with (self.log_dir / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "weir.cli", *SERVICES[service]],
                env=environment,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.processes.append(process)
        self.by_name[name] = process
        return process

    def start_mesh(self, http_port: int) -> str:
        """A batcher, a worker and a gateway on ``http_port``; its URL once it is ready."""
        self.start("batcher", "batcher")
        self.start("worker", "worker")
        self.start("gateway", "gateway", WEIR_GATEWAY_HTTP_PORT=str(http_port))
        url = f"http://127.0.0.1:{http_port}"
        wait_until(lambda: http_ready(f"{url}/v2/health/ready"), 60, "the mesh")
        return url

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def tiny_body(row: np.ndarray) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, row.size], "data": row.tolist()}
        ]
    }


@dataclass
class Outcome:
    """What one request got: HTTP status (0: no response), output row, and when (monotonic).

    ``sent_s``: when the client sent it; ``done_s``: when its answer came back.
    """

    status: int
    output: np.ndarray | None
    sent_s: float
    row: int
    error: str = ""
    done_s: float = 0.0


async def request(
    client: httpx.AsyncClient, url: str, model: str, rows: np.ndarray, i: int
) -> Outcome:
    sent = time.monotonic()
    try:
        response = await client.post(f"{url}/v2/models/{model}/infer", json=tiny_body(rows[i]))
    except httpx.HTTPError:
        return Outcome(0, None, sent, i, done_s=time.monotonic())
    if response.status_code != 200:
        return Outcome(response.status_code, None, sent, i, response.text, time.monotonic())
    output = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32)
    return Outcome(response.status_code, output, sent, i, done_s=time.monotonic())


async def closed_loop(
    urls: Callable[[], list[str]],
    model: str,
    rows: np.ndarray,
    concurrency: int,
    stop: asyncio.Event,
    max_requests: int,
    outcomes: list[Outcome] | None = None,
    in_flight: dict[str, int] | None = None,
) -> list[Outcome]:
    """``concurrency`` clients, each sending its next request when the last is answered.

    Outcomes are appended to ``outcomes`` (when given) as they come, and ``in_flight``
    counts the requests under way per URL, for a watcher.
    """
    outcomes = [] if outcomes is None else outcomes
    in_flight = {} if in_flight is None else in_flight
    counter = iter(range(max_requests))

    async def client_loop(client: httpx.AsyncClient) -> None:
        for i in counter:
            if stop.is_set():
                return
            targets = urls()
            target = targets[i % len(targets)]
            in_flight[target] = in_flight.get(target, 0) + 1
            try:
                outcomes.append(await request(client, target, model, rows, i % len(rows)))
            finally:
                in_flight[target] -= 1

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return outcomes
