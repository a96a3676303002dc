"""A load within its timeout (workers.loading): the result, the error, or ``LoadTimedOut``.

Real threads run the builds; the records of loads that timed out go to a real Redis.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.conftest import RedisServer
from weir.config import ModelConfig
from workers.loading import LoadTimedOut, TimedOutLoads, load_timeout, load_within, uncounted


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    connection = Redis.from_url(redis_server.url)
    yield connection
    await connection.aclose()


async def test_a_load_that_ends_gives_its_result_or_its_error() -> None:
    assert await load_within(lambda: [1, 2], 5.0, "m:1") == [1, 2]
    assert await load_within(lambda: "no limit", None, "m:1") == "no limit"

    def broken() -> None:
        raise RuntimeError("the weights are missing")

    with pytest.raises(RuntimeError, match="the weights are missing"):
        await load_within(broken, 5.0, "m:1")


async def test_a_load_past_its_timeout_is_given_up_on_and_left_to_its_thread() -> None:
    never = threading.Event()
    started = time.monotonic()
    with pytest.raises(LoadTimedOut, match=r"within its load timeout \(0.3 s\)") as raised:
        await load_within(never.wait, 0.3, "m:1")
    assert 0.3 <= time.monotonic() - started < 5
    assert raised.value.fresh
    loading = [t for t in threading.enumerate() if t.name == "load m:1"]
    assert loading and all(t.daemon for t in loading)  # it cannot hold the process's exit
    never.set()


async def test_time_in_an_uncounted_step_does_not_count() -> None:
    gate = threading.Event()

    def installs_then_loads() -> str:
        with uncounted():  # an archive's requirements being installed, say
            gate.wait()
        return "loaded"

    load = asyncio.create_task(load_within(installs_then_loads, 0.2, "m:1"))
    # Three times the timeout spent installing, and the load still waits.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(load), 0.6)
    gate.set()
    assert await load == "loaded"


def test_the_timeout_is_the_models_parameter_else_the_workers_setting() -> None:
    def config(**parameters: str) -> ModelConfig:
        tensor = {"data_type": "TYPE_FP32", "dims": [1]}
        return ModelConfig.model_validate(
            {
                "name": "m",
                "backend": "python",
                "input": [{"name": "X", **tensor}],
                "output": [{"name": "Y", **tensor}],
                "parameters": parameters,
            }
        )

    assert load_timeout(config(load_timeout_s="2.5"), 60.0) == 2.5
    assert load_timeout(config(), 60.0) == 60.0
    assert load_timeout(config(), 0.0) is None  # no limit
    with pytest.raises(ValueError, match="load_timeout_s must be a number of seconds > 0"):
        config(load_timeout_s="never")


async def test_a_timed_out_load_is_remembered_for_its_attempt_only(client: Redis) -> None:
    model = f"m-{uuid.uuid4().hex[:8]}"
    cpu, gpu = TimedOutLoads(client, "cpu"), TimedOutLoads(client, "gpu")
    assert await cpu.reason(model, "1", "stamp-a") is None
    await cpu.record(model, "1", "stamp-a", "did not finish loading within 2 s")
    assert await cpu.reason(model, "1", "stamp-a") == "did not finish loading within 2 s"
    assert await cpu.reason(model, "1", "stamp-b") is None  # loaded again: tried again
    assert await cpu.reason(model, "2", "stamp-a") is None
    assert await gpu.reason(model, "1", "stamp-a") is None  # another pool loads on its own
    # That attempt timing out too keeps the first: a failed load undone goes back to it.
    await cpu.record(model, "1", "stamp-b", "did not finish loading within 3 s")
    assert await cpu.reason(model, "1", "stamp-a") == "did not finish loading within 2 s"
    assert await cpu.reason(model, "1", "stamp-b") == "did not finish loading within 3 s"
