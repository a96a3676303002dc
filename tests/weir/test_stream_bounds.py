"""Streams stay bounded under steady load: every stage trims what its readers consumed.

The mesh runs on its own redis-server and a temporary repository holding ``tiny_mlp``,
with the batcher and the worker trimming every 0.2 s. While 16 clients send thousands of
requests, a sampler reads the length of each stream a request crosses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest
import redis
import redis.asyncio as aredis

from tests.conftest import Mesh, start_mesh, wait_until
from weir import names
from weir.redis_server import RedisServer

MODEL = "tiny_mlp"
REQUESTS = 3000
CLIENTS = 16
LOAD_BUDGET_S = 20.0
SAMPLE_EVERY_S = 0.2
# Far below the requests sent: MINID ~ trims whole 100-entry nodes, so a trimmed stream keeps
# up to a node beyond what its readers still need, plus what arrives between trims.
MAX_STREAM_LENGTH = 1000
# Once the load stops, what is left is at most the node that holds the last consumed entry.
IDLE_LENGTH = 100
REPLY_STREAMS = "reply"


@pytest.fixture
def loaded_mesh(build_models: ModuleType, tmp_path: Path) -> Iterator[Mesh]:
    repository = tmp_path / "models"
    build_models.build_model(repository, MODEL)
    intervals = {"WEIR_BATCHER_TRIM_INTERVAL_S": "0.2", "WEIR_WORKER_TRIM_INTERVAL_S": "0.2"}
    with RedisServer() as server:
        running = start_mesh(server.url, repository, intervals)
        try:
            yield running
        finally:
            running.stop()


class Sampler:
    """Samples XLEN of the model's streams and of every gateway reply stream."""

    def __init__(self, redis_url: str) -> None:
        self.client = aredis.Redis.from_url(redis_url)
        self.streams = {
            "requests": names.request_stream(MODEL, "1"),
            "batches": names.batch_stream(MODEL, "1"),
            "credits": names.credit_stream(MODEL, "1"),
        }
        self.max_length: dict[str, int] = dict.fromkeys([*self.streams, REPLY_STREAMS], 0)
        self.samples = 0

    async def sample(self) -> None:
        lengths = {kind: await self.client.xlen(key) for kind, key in self.streams.items()}
        replies = [k async for k in self.client.scan_iter(match=names.reply_stream("*"))]
        lengths[REPLY_STREAMS] = max([await self.client.xlen(k) for k in replies], default=0)
        for kind, length in lengths.items():
            self.max_length[kind] = max(self.max_length[kind], length)
        self.samples += 1

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)


async def drive(mesh: Mesh, sampler: Sampler) -> list[int]:
    """Send REQUESTS requests from CLIENTS concurrent clients; the status codes."""
    x = np.random.default_rng(5).standard_normal((1, 64), dtype=np.float32)
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": x.tolist()}]
    }
    statuses: list[int] = []
    deadline = time.monotonic() + LOAD_BUDGET_S
    limits = httpx.Limits(max_connections=CLIENTS)

    async with httpx.AsyncClient(base_url=mesh.url, timeout=30, limits=limits) as http:

        async def client() -> None:
            while len(statuses) < REQUESTS and time.monotonic() < deadline:
                response = await http.post(f"/v2/models/{MODEL}/infer", json=body)
                statuses.append(response.status_code)

        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler.run(stop))
        try:
            await asyncio.gather(*(client() for _ in range(CLIENTS)))
        finally:
            stop.set()
            await sampling
            await sampler.client.aclose()
    return statuses


def queued(mesh: Mesh) -> int:
    with redis.Redis.from_url(mesh.redis_url) as client:
        return int(client.get(names.queued_counter(MODEL, "1")) or 0)


def lengths(mesh: Mesh) -> dict[str, int]:
    with redis.Redis.from_url(mesh.redis_url) as client:
        keys = [
            names.request_stream(MODEL, "1"),
            names.batch_stream(MODEL, "1"),
            names.credit_stream(MODEL, "1"),
            *client.scan_iter(match=names.reply_stream("*")),
        ]
        return {str(key): client.xlen(key) for key in keys}


def executions(mesh: Mesh) -> int:
    with redis.Redis.from_url(mesh.redis_url) as client:
        return int(client.hget(names.model_stats(MODEL, "1"), "execution_count") or 0)


def test_streams_stay_bounded_under_steady_load(loaded_mesh: Mesh) -> None:
    sampler = Sampler(loaded_mesh.redis_url)

    statuses = asyncio.run(drive(loaded_mesh, sampler))

    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    # More requests crossed the request and reply streams than the bound allows them to hold.
    assert len(statuses) > MAX_STREAM_LENGTH, f"only {len(statuses)} requests in the budget"
    assert sampler.samples >= 5
    for kind, length in sampler.max_length.items():
        assert length <= MAX_STREAM_LENGTH, f"{kind} stream reached {length} entries"
    wait_until(lambda: queued(loaded_mesh) == 0, 10, "the queued counter to return to 0")
    # Idle, each stream shrinks to its last node; batches and credits had more than that.
    assert executions(loaded_mesh) > IDLE_LENGTH
    wait_until(
        lambda: max(lengths(loaded_mesh).values()) <= IDLE_LENGTH,
        5,
        f"every stream to be trimmed to {IDLE_LENGTH} entries once idle",
    )
