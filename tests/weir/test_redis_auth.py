"""The mesh against a Redis that demands credentials: a password, and an ACL user.

Each test runs its own ``redis-server --requirepass`` (RedisServer starts none with a
password) and a mesh whose ``WEIR_REDIS_URL`` carries the credentials.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.conftest import Mesh, assert_serves_tiny_mlp, start_mesh
from weir import names
from weir.redis_server import find_redis_server, free_port, wait_for_port

PASSWORD = "s3cret"
ACL_USER = "weir"
ACL_PASSWORD = "pw"


@pytest.fixture(scope="module")
def tiny_repository(build_models: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("redis-auth") / "models"
    build_models.build_model(repository, "tiny_mlp")
    return repository


@pytest.fixture
def password_redis(tmp_path: Path) -> Iterator[int]:
    """A redis-server on a free loopback port that requires PASSWORD; yields the port."""
    port = free_port()
    command = [
        find_redis_server(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--requirepass",
        PASSWORD,
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp_path),
        "--loglevel",
        "warning",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_port(port, 10)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def admin(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, password=PASSWORD)


def run_mesh(redis_url: str, repository: Path) -> Iterator[Mesh]:
    running = start_mesh(redis_url, repository)
    try:
        yield running
    finally:
        running.stop()


def test_the_server_refuses_clients_without_the_password(password_redis: int) -> None:
    with (
        # No retries: an AuthenticationError is a ConnectionError, which redis-py retries.
        redis.Redis(
            host="127.0.0.1", port=password_redis, retry=Retry(NoBackoff(), 0)
        ) as anonymous,
        pytest.raises(redis.AuthenticationError),
    ):
        anonymous.ping()
    with admin(password_redis) as client:
        assert client.ping()


def test_mesh_serves_with_a_password_in_the_url(
    password_redis: int, tiny_repository: Path, build_models: ModuleType
) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{password_redis}/0"

    for mesh in run_mesh(url, tiny_repository):
        assert_serves_tiny_mlp(mesh, build_models, rows=2, seed=3)
        with admin(password_redis) as client:
            assert client.exists(names.request_stream("tiny_mlp", "1"))
            assert int(client.hget(names.model_stats("tiny_mlp", "1"), "inference_count")) == 2


def test_mesh_serves_as_an_acl_user(
    password_redis: int, tiny_repository: Path, build_models: ModuleType
) -> None:
    with admin(password_redis) as client:
        client.execute_command(
            "ACL", "SETUSER", ACL_USER, "on", f">{ACL_PASSWORD}", "~*", "&*", "+@all"
        )
    url = f"redis://{ACL_USER}:{ACL_PASSWORD}@127.0.0.1:{password_redis}/0"

    for mesh in run_mesh(url, tiny_repository):
        assert_serves_tiny_mlp(mesh, build_models, rows=2, seed=3)
        with admin(password_redis) as client:
            users = {entry.get("user") for entry in client.client_list()}
            assert ACL_USER in users, users
