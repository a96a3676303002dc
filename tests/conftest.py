"""Shared fixtures: a real redis-server, the example repository, and a running mesh.

The mesh fixture starts the real services as processes (``python -m weir.cli ...``), the
way ``weir up`` and compose start them, against a private redis-server.
"""

from __future__ import annotations

import fcntl
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from httpx._transports import default as httpx_transports

from weir import names
from weir.redis_io.connection import connect_sync
from weir.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"
BODY_LIMIT_BYTES = 2 * 1024 * 1024

# Every httpx.get/post builds a client, and every client an SSL context from the machine's
# CA bundle: 70-90 ms of CPU here, for tests that speak plain HTTP to 127.0.0.1, and polls
# such as http_ready make one per try (tests/weir and tests/lifecycle made 504: 47 s of CPU,
# most of it while a mesh starts on the same two cores). One context per setting, shared.
httpx_transports.create_ssl_context = functools.cache(httpx_transports.create_ssl_context)


def load_build_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_models", ROOT / "examples" / "build_models.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_models"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def build_models() -> ModuleType:
    return load_build_models()


@pytest.fixture(scope="session")
def example_repository(build_models: ModuleType) -> Path:
    # Each test process (pytest-xdist) asks for it: the first builds what is missing under
    # the lock, the others then find it built, not half-written.
    name = f"weir-examples-{zlib.crc32(bytes(EXAMPLES)):08x}.lock"
    lock_path = Path(tempfile.gettempdir()) / name
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_models.build_repository(EXAMPLES)
    return EXAMPLES


@pytest.fixture(scope="session")
def tiny_repository(example_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository of tiny_mlp alone, for a private mesh that serves nothing else.

    A worker loads and warms every model of its repository before the mesh is ready: the
    whole example repository costs a private mesh several seconds of start-up it never uses.
    """
    root = tmp_path_factory.mktemp("tiny-repository")
    shutil.copytree(example_repository / "tiny_mlp", root / "tiny_mlp")
    return root


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A real Redis Cluster: three primaries, three replicas (tests.redis_cluster)."""
    from tests.redis_cluster import ClusterSet

    with ClusterSet() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_kind(request: pytest.FixtureRequest) -> str:
    """What the session mesh runs on: one redis-server, or (where a module asks) a cluster."""
    return str(getattr(request, "param", "single"))


# The longest modules start first, so that with several test processes (pytest-xdist, whole
# files per process) they run beside the rest rather than alone at the end.
FIRST = ("tests/deploy/test_compose_docker.py", "tests/chaos/test_redis_failover.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the tests of :data:`FIRST` first, in that order; the rest keep theirs."""

    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(ROOT).as_posix()
        return FIRST.index(path) if path in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: the order within each module and of the rest stays


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``cluster_too`` whose mesh is the session's runs on a cluster as well."""
    if "redis_kind" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "cluster_too"
    ):
        metafunc.parametrize("redis_kind", ["single", "cluster"], indirect=True, scope="session")


def wait_until(condition, timeout_s: float, what: str, interval_s: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until it is true; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def wait_queued(mesh: Mesh, count: int, model: str = "tiny_mlp", version: str = "1") -> None:
    """Wait until ``count`` requests of ``model`` were admitted (its queued counter says so)."""
    client = connect_sync(mesh.redis_url)
    key = names.queued_counter(model, version)
    try:
        wait_until(lambda: int(client.get(key) or 0) >= count, 10, f"{count} queued requests")
    finally:
        client.close()


def http_ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Mesh:
    """A running gateway, batcher and CPU worker pool."""

    url: str
    redis_url: str
    repository: Path
    processes: dict[str, subprocess.Popen[bytes]]
    metrics_url: str = ""
    grpc_target: str = ""

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start_mesh(redis_url: str, repository: Path, env_extra: dict[str, str] | None = None) -> Mesh:
    port = free_port()
    metrics_port = free_port()
    grpc_port = free_port()
    env = {
        **os.environ,
        "WEIR_REDIS_URL": redis_url,
        "WEIR_REPOSITORY": str(repository),
        "WEIR_GATEWAY_HTTP_PORT": str(port),
        "WEIR_GATEWAY_HOST": "127.0.0.1",
        "WEIR_GATEWAY_BODY_LIMIT_BYTES": str(BODY_LIMIT_BYTES),
        "WEIR_GATEWAY_METRICS_PORT": str(metrics_port),
        "WEIR_GATEWAY_GRPC_PORT": str(grpc_port),
        "WEIR_WORKER_TORCH_THREADS": "1",
        **(env_extra or {}),
    }
    commands = {
        "batcher": ["batcher"],
        "worker": ["worker", "--pool", "cpu"],
        "gateway": ["gateway"],
    }
    processes = {
        name: subprocess.Popen([sys.executable, "-m", "weir.cli", *args], env=env, cwd=ROOT)
        for name, args in commands.items()
    }
    mesh = Mesh(
        f"http://127.0.0.1:{port}",
        redis_url,
        repository,
        processes,
        f"http://127.0.0.1:{metrics_port}/metrics",
        f"127.0.0.1:{grpc_port}",
    )
    try:
        wait_until(lambda: http_ready(f"{mesh.url}/v2/health/ready"), 60, "the mesh to be ready")
    except BaseException:
        mesh.stop()
        raise
    return mesh


def assert_serves_tiny_mlp(mesh: Mesh, build_models: ModuleType, rows: int, seed: int) -> None:
    """One tiny_mlp inference of ``rows`` seeded rows equals the torch reference."""
    import numpy as np
    import torch

    x = np.random.default_rng(seed).standard_normal((rows, 64), dtype=np.float32)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, 64], "data": x.tolist()}]
    }
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    with torch.inference_mode():
        want = build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


@contextmanager
def private_redis(kind: str = "single") -> Iterator[Any]:
    """A Redis of the test's own: a redis-server, or a cluster (anything with a ``url``)."""
    if kind == "cluster":
        from tests.redis_cluster import ClusterSet

        with ClusterSet() as cluster:
            yield cluster
    else:
        with RedisServer() as server:
            yield server


@contextmanager
def private_mesh(
    repository: Path, env_extra: dict[str, str] | None = None, kind: str = "single"
) -> Iterator[Mesh]:
    """A mesh on a Redis of its own (:func:`private_redis`); both stop on leaving."""
    with private_redis(kind) as server:
        running = start_mesh(server.url, repository, env_extra)
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture(scope="session")
def mesh(
    redis_kind: str, example_repository: Path, request: pytest.FixtureRequest
) -> Iterator[Mesh]:
    server = request.getfixturevalue("redis_cluster" if redis_kind == "cluster" else "redis_server")
    running = start_mesh(server.url, example_repository)
    yield running
    running.stop()


@pytest.fixture
def triton_http(mesh: Mesh) -> Iterator[Any]:
    """tritonclient's HTTP client on the session mesh."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture
def triton_grpc(mesh: Mesh) -> Iterator[Any]:
    """tritonclient's gRPC client on the session mesh."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    yield client
    client.close()
