"""compose.yaml's topology, run as local processes: what `docker compose up` would start.

No Docker engine runs here, so the test plays compose's part. It reads compose.yaml, takes
every service that `docker compose up` starts (no profile) except Redis and the one-shot
`models`, and runs each one's ``command`` with its ``environment`` as a local process, the
way compose would run it in a container: service host names point at 127.0.0.1 (Redis at a
private redis-server), mounts at host directories, and the gateway's container ports (HTTP,
gRPC and metrics) at free local ports, so that parallel runs never collide. worker-cpu runs
twice, as `docker compose up --scale worker-cpu=2` would. The gateway runs once with
compose's default of one process and once with WEIR_GATEWAY_PROCESSES=2, as the Kubernetes
base runs it.

The model repository mount's source, by default the named volume `models` that the one-shot
fills with every example model, is swapped for a copy of the example repository that holds
tiny_mlp alone: the example repository keeps growing (BERT, a MiniLM pipeline), and building
it, or two workers loading all of it, would be most of this test's time. test_compose_file
checks the real mounts and the one-shot's command.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as grpcclient
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import http_ready, load_build_models, wait_until
from tests.deploy.deploy_files import (
    COMPOSE_FILE,
    GRPC_PORT,
    HEALTH_PATHS,
    K8S,
    METRICS_PORT,
    Mount,
    compose_mount,
    compose_mounts,
    duration_s,
    load_compose,
    parse_weir,
)
from weir import names
from weir.redis_server import RedisServer, free_port

ROOT = COMPOSE_FILE.parent
SCALE = {"worker-cpu": 2}
REQUESTS = 16
MODEL = "tiny_mlp"
EXAMPLES = ROOT / "examples" / "models"


@dataclass
class Container:
    """One service replica, run as a local process."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return f"--- {self.name} ---\n" + "\n".join(self.log.read_text().splitlines()[-30:])


class LocalCompose:
    """Maps compose's container world onto this host."""

    def __init__(
        self,
        compose: dict[str, Any],
        redis_port: int,
        http_port: int,
        metrics_port: int,
        grpc_port: int,
        sources: dict[str, Path] | None = None,
    ) -> None:
        self.compose = compose
        # (service, container port) -> local port
        self.ports = {
            ("redis", 6379): redis_port,
            ("gateway", 8000): http_port,
            ("gateway", METRICS_PORT): metrics_port,
            ("gateway", GRPC_PORT): grpc_port,
        }
        # mount source as written in compose.yaml -> the host directory to use instead
        self.sources = sources or {}

    def services(self) -> list[str]:
        """What `docker compose up` starts, less Redis and the one-shot `models`.

        The test runs its own Redis, and supplies its own model repository in place of the
        volume `models` fills (the real-engine test runs the one-shot itself).
        """
        return [
            name
            for name, service in self.compose["services"].items()
            if not service.get("profiles") and name not in ("redis", "models")
        ]

    def argv(self, service: str) -> list[str]:
        command = self.compose["services"][service]["command"]
        parse_weir(command)
        return [sys.executable, "-m", "weir.cli", *command[1:]]

    def env(self, service: str) -> dict[str, str]:
        spec = self.compose["services"][service]
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEIR_")}
        for key, value in spec["environment"].items():
            env[key] = self._localize(service, key, str(value))
        return env

    def _localize(self, service: str, key: str, value: str) -> str:
        url = urlsplit(value)
        if url.hostname in self.compose["services"] and url.port is not None:
            local = self.ports[(url.hostname, url.port)]
            return urlunsplit(url._replace(netloc=f"127.0.0.1:{local}"))
        for mount in compose_mounts(self.compose, service):
            if value == mount.target:
                return str(self._host_path(mount))
        if key.endswith("_HOST") and value == "0.0.0.0":
            return "127.0.0.1"  # loopback only: the test serves nothing beyond this machine
        if key.endswith("_PORT") and (service, int(value)) in self.ports:
            return str(self.ports[(service, int(value))])
        return value

    def _host_path(self, mount: Mount) -> Path:
        """Where a mount's files are on this host: a swapped-in source, or the bind's path."""
        if mount.source in self.sources:
            return self.sources[mount.source].resolve()
        assert not mount.named, f"volume {mount.source} has no host directory: supply one"
        return (ROOT / mount.source).resolve()

    def healthcheck(self, service: str) -> list[str]:
        test = self.compose["services"][service]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "python"]
        return [sys.executable, *test[2:]]


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for container in started:
        if container.process.poll() is None:
            container.process.kill()
            container.process.wait()


def start(local: LocalCompose, service: str, replica: int, tmp_path: Path) -> Container:
    log = tmp_path / f"{service}-{replica}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            local.argv(service),
            env=local.env(service),
            cwd=tmp_path,  # nothing may depend on running from the repository
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Container(f"{service}-{replica}", process, log)


def running(containers: list[Container]) -> bool:
    """True while every container runs; fails the test with the logs when one has died."""
    dead = [c for c in containers if c.process.poll() is not None]
    if dead:
        pytest.fail("exited early:\n" + "\n".join(c.tail() for c in dead))
    return True


def wait_showing_logs(
    containers: list[Container], condition: Any, timeout_s: float, what: str
) -> None:
    """``wait_until`` that shows every container's log when it times out."""
    try:
        wait_until(lambda: running(containers) and condition(), timeout_s, what)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}\n" + "\n".join(c.tail() for c in containers))


def infer(url: str, rows: np.ndarray) -> list[np.ndarray]:
    def one(row: np.ndarray) -> np.ndarray:
        tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, row.size]}
        body = {"inputs": [{**tensor, "data": row.tolist()}]}
        response = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        (output,) = response.json()["outputs"]
        return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])

    with ThreadPoolExecutor(REQUESTS) as pool:
        return list(pool.map(one, rows))


def infer_grpc(target: str, x: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(target) as client:
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        output: np.ndarray = client.infer(MODEL, [tensor]).as_numpy("OUTPUT0")
        return output


def tiny_repository(root: Path) -> Path:
    """A model repository with the example's tiny_mlp alone: its committed config, built."""
    (root / MODEL).mkdir(parents=True)
    shutil.copy(EXAMPLES / MODEL / "config.yaml", root / MODEL / "config.yaml")
    load_build_models().build_model(root, MODEL)
    return root


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET a metrics endpoint: (sample name, sorted labels) -> value."""
    response = httpx.get(url, timeout=5)
    assert response.status_code == 200, response.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def k8s_gateway_probe_paths() -> list[str]:
    gateway = yaml.safe_load_all((K8S / "gateway.yaml").read_text())
    (container,) = next(d for d in gateway if d["kind"] == "Deployment")["spec"]["template"][
        "spec"
    ]["containers"]
    return [container[probe]["httpGet"]["path"] for probe in HEALTH_PATHS]


@pytest.mark.parametrize("gateway_processes", [None, "2"], ids=["default", "2-processes"])
def test_compose_services_as_local_processes_serve_correct_inferences_with_two_cpu_workers(
    containers: list[Container], tmp_path: Path, gateway_processes: str | None
) -> None:
    shell = {} if gateway_processes is None else {"WEIR_GATEWAY_PROCESSES": gateway_processes}
    compose = load_compose(shell)
    # By default the services read the named volume that the one-shot `models` fills with the
    # whole example repository; the test swaps in its tiny repository for that volume.
    mount = compose_mount(compose, "worker-cpu", "/models")
    assert mount == Mount("models", "/models", read_only=True, named=True)
    sources = {mount.source: tiny_repository(tmp_path / "models")}
    # A private Redis: the session's may carry another mesh's streams for the same models.
    with RedisServer() as server:
        local = LocalCompose(compose, server.port, free_port(), free_port(), free_port(), sources)
        for service in local.services():
            for replica in range(SCALE.get(service, 1)):
                containers.append(start(local, service, replica, tmp_path))
        assert sorted(c.name for c in containers) == [
            "batcher-0", "gateway-0", "worker-cpu-0", "worker-cpu-1",
        ]  # fmt: skip
        gateway_env = local.env("gateway")
        assert gateway_env["WEIR_GATEWAY_PROCESSES"] == (gateway_processes or "1")
        url = f"http://127.0.0.1:{gateway_env['WEIR_GATEWAY_HTTP_PORT']}"
        metrics_url = f"http://127.0.0.1:{gateway_env['WEIR_GATEWAY_METRICS_PORT']}/metrics"
        assert gateway_env["WEIR_GATEWAY_METRICS_PORT"] != str(METRICS_PORT)
        wait_showing_logs(
            containers,
            lambda: http_ready(f"{url}/v2/health/ready"),
            60,
            "the compose gateway to be ready",
        )

        # compose's healthcheck and the Kubernetes probes pass against the running gateway.
        check = subprocess.run(local.healthcheck("gateway"), env=gateway_env, timeout=10)
        assert check.returncode == 0
        for path in k8s_gateway_probe_paths():
            assert httpx.get(f"{url}{path}", timeout=5).status_code == 200, path

        rows = np.random.default_rng(7).standard_normal((REQUESTS, 64)).astype(np.float32)
        outputs = infer(url, rows)
        with torch.no_grad():
            expected = load_build_models().reference_module(MODEL)(torch.from_numpy(rows))
        np.testing.assert_allclose(np.concatenate(outputs), expected.numpy(), rtol=1e-4, atol=1e-5)

        # The gateway's one metrics endpoint (for all its processes) counts every request it
        # answered, and reports the workers' batches and the queue from Redis.
        lane = (("model", MODEL), ("version", "1"))
        success = ("weir_inference_request_success_total", lane)
        # Each process of a multi-process gateway hands its counts on every metrics_flush_s.
        wait_until(lambda: scrape(metrics_url).get(success) == REQUESTS, 10, "the counts")
        metrics = scrape(metrics_url)
        assert metrics[success] == REQUESTS
        assert metrics[("weir_inference_request_duration_us_count", lane)] == REQUESTS
        assert metrics[("weir_inference_count_total", lane)] == REQUESTS
        assert 1 <= metrics[("weir_inference_exec_count_total", lane)] <= REQUESTS
        assert metrics[("weir_inference_pending_request_count", lane)] == 0

        # Both worker-cpu replicas joined the one consumer group of the model's batch stream.
        client = redis.Redis(port=server.port)
        stream = names.batch_stream(MODEL, "1")
        wait_showing_logs(
            containers,
            lambda: len(client.xinfo_consumers(stream, names.WORKER_GROUP)) == 2,
            30,
            "two worker consumers on the batch stream",
        )
        client.close()

        # gRPC on the same gateway, a new connection each time so that with two processes
        # both answer; after the metrics above, which count HTTP's requests alone.
        assert gateway_env["WEIR_GATEWAY_GRPC_PORT"] != str(GRPC_PORT)
        grpc_target = f"127.0.0.1:{gateway_env['WEIR_GATEWAY_GRPC_PORT']}"
        np.testing.assert_allclose(
            np.concatenate([infer_grpc(grpc_target, row[None]) for row in rows[:6]]),
            expected.numpy()[:6],
            rtol=1e-4,
            atol=1e-5,
        )

        grace_s = min(
            duration_s(compose["services"][name]["stop_grace_period"]) for name in local.services()
        )
        stop_all(containers, grace_s)


def stop_all(containers: list[Container], grace_s: float) -> None:
    """SIGTERM every container, as `docker compose down` does; each must exit 0 in grace.

    0, not 143: Docker and Kubernetes count a service that drained as one that succeeded.
    """
    for container in containers:
        container.process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    wait_until(
        lambda: all(c.process.poll() is not None for c in containers),
        grace_s,
        "every service to drain and exit within compose's stop_grace_period",
    )
    failed = [c for c in containers if c.process.returncode != 0]
    assert not failed, "\n".join(f"exit {c.process.returncode}\n{c.tail()}" for c in failed)
    assert time.monotonic() - started < grace_s
