"""Work nobody waits for is dropped: clients that leave, and handlers that see it.

One mesh on its own redis-server serves a Python model with one instance and batches of
one, whose handler sleeps ``X`` seconds, or, for a negative ``X``, loops until
``context.is_cancelled()`` says nobody waits (at most 30 s). Requests queued behind a busy
instance and then abandoned (HTTP disconnect, gRPC cancel) must not hold up a request that
comes after them; each counts as ``reason="CANCELED"``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient

from tests.conftest import Mesh, private_mesh, wait_until
from tests.sleeper import write_sleeper
from weir import names

SLEEP_S = 0.25  # each abandoned request would hold the instance this long
ABANDONED = 24  # so running them all would take 6 s
LOOP_LIMIT_S = 30

HANDLER = f"""
import time

from weir.errors import DeadlineExceeded


class Sleeps:
    def initialize(self, context):
        self.context = context
        self.marker = context.model_dir / "running"

    def inference(self, batch):
        value = float(batch["X"].reshape(-1)[0])
        if value >= 0:
            time.sleep(value)
            return {{"Y": batch["X"]}}
        self.marker.touch()
        started = time.monotonic()
        while not self.context.is_cancelled():
            if time.monotonic() - started > {LOOP_LIMIT_S}:
                return {{"Y": batch["X"]}}
            time.sleep(0.01)
        raise DeadlineExceeded("gave up: nobody waits")
"""


def write_model(repository: Path) -> Path:
    return write_sleeper(repository, HANDLER) / "running"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cancel") / "models"
    write_model(root)
    return root


@pytest.fixture(scope="module")
def sleeper_mesh(repository: Path) -> Iterator[Mesh]:
    env = {"WEIR_GATEWAY_MAX_CONNECTIONS": "1000"}
    with private_mesh(repository, env) as running:
        yield running


@pytest.fixture
def queued(sleeper_mesh: Mesh) -> Iterator[Callable[[], int]]:
    client = redis.Redis.from_url(sleeper_mesh.redis_url)
    key = names.queued_counter("sleeper", "1")
    yield lambda: int(client.get(key) or 0)
    client.close()


def body(value: float, **parameters: int) -> dict[str, object]:
    tensor = {"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [value]}
    return {"inputs": [tensor], "parameters": parameters}


def timed_request(mesh: Mesh, value: float) -> float:
    started = time.monotonic()
    response = httpx.post(f"{mesh.url}/v2/models/sleeper/infer", json=body(value), timeout=60)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def canceled_count(mesh: Mesh) -> float:
    wanted = 'weir_inference_request_failure_total{model="sleeper",reason="CANCELED",version="1"}'
    for line in httpx.get(mesh.metrics_url).text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def abandon_http(mesh: Mesh, queued: Callable[[], int], value: float, count: int) -> int:
    """Send ``count`` requests, wait until the mesh holds them, then drop the connections.

    How many were answered before that: the instance runs one while the rest arrive, and a
    slow machine may take longer than one to admit them all.
    """
    limits = httpx.Limits(max_connections=count + 1)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        url = f"{mesh.url}/v2/models/sleeper/infer"
        tasks = [asyncio.create_task(client.post(url, json=body(value))) for _ in range(count)]

        def held() -> bool:  # each queued or answered
            return queued() + sum(task.done() for task in tasks) >= count

        await wait_for(held, 30, f"{count} requests to be queued")
        for task in tasks:
            task.cancel()
        replies = await asyncio.gather(*tasks, return_exceptions=True)
    return sum(isinstance(reply, httpx.Response) for reply in replies)


def test_requests_whose_http_clients_left_are_not_run(
    sleeper_mesh: Mesh, queued: Callable[[], int]
) -> None:
    before = canceled_count(sleeper_mesh)
    answered = asyncio.run(abandon_http(sleeper_mesh, queued, SLEEP_S, ABANDONED))
    # Run, they would hold the instance ABANDONED * SLEEP_S = 6 s; at most the one running
    # and the one sent to the worker before the notice came still run.
    assert timed_request(sleeper_mesh, 0.0) < 3 * SLEEP_S + 1.5
    wait_until(lambda: queued() == 0, 10, "the queued counter to settle")
    # One may have been answered (it was running) before its client left.
    left = ABANDONED - answered
    assert left - 2 <= canceled_count(sleeper_mesh) - before <= left


def test_requests_whose_grpc_calls_were_cancelled_are_not_run(
    sleeper_mesh: Mesh, queued: Callable[[], int]
) -> None:
    before = canceled_count(sleeper_mesh)
    client = grpcclient.InferenceServerClient(sleeper_mesh.grpc_target)
    tensor = grpcclient.InferInput("X", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), SLEEP_S, np.float32))
    answered: list[object] = []  # results of the calls answered before they were cancelled
    try:
        calls = [
            client.async_infer(
                "sleeper", [tensor], callback=lambda result, error: error or answered.append(result)
            )
            for _ in range(ABANDONED)
        ]
        # Each queued or answered: one runs while the rest arrive, more on a slow machine.
        wait_until(lambda: queued() + len(answered) >= ABANDONED, 30, "the calls to be queued")
        for call in calls:
            call.cancel()
        left = ABANDONED - len(answered)
        assert timed_request(sleeper_mesh, 0.0) < 3 * SLEEP_S + 1.5
    finally:
        client.close()
    wait_until(lambda: queued() == 0, 10, "the queued counter to settle")
    wait_until(lambda: canceled_count(sleeper_mesh) - before >= left - 2, 10, "CANCELED counted")


def test_a_running_handler_sees_its_client_leave(
    sleeper_mesh: Mesh, repository: Path, queued: Callable[[], int]
) -> None:
    marker = repository / "sleeper" / "1" / "running"
    marker.unlink(missing_ok=True)

    async def leave_while_running() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            url = f"{sleeper_mesh.url}/v2/models/sleeper/infer"
            task = asyncio.create_task(client.post(url, json=body(-1.0)))
            await wait_for(marker.exists, 20, "the handler to run")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(leave_while_running())
    # The handler loops until nobody waits: freed at once, not after LOOP_LIMIT_S.
    assert timed_request(sleeper_mesh, 0.0) < 5
    wait_until(lambda: queued() == 0, 10, "the queued counter to settle")


def test_a_running_handler_sees_its_deadline_pass(sleeper_mesh: Mesh) -> None:
    started = time.monotonic()
    response = httpx.post(
        f"{sleeper_mesh.url}/v2/models/sleeper/infer", json=body(-1.0, timeout=300_000), timeout=60
    )
    assert response.status_code == 504, response.text
    assert "Request timeout expired" in response.json()["error"]
    assert timed_request(sleeper_mesh, 0.0) < 5
    assert time.monotonic() - started < LOOP_LIMIT_S / 3


def test_a_slow_answer_on_a_kept_alive_connection_is_not_cut_off(sleeper_mesh: Mesh) -> None:
    # uvicorn closes a kept-alive connection idle for 5 s; a request that arrived on it
    # stops that timer, however long its answer takes.
    url = f"{sleeper_mesh.url}/v2/models/sleeper/infer"
    with httpx.Client(timeout=60) as client:
        assert client.post(url, json=body(0.0)).status_code == 200
        slow = client.post(url, json=body(5.5))
    assert slow.status_code == 200, slow.text
