"""Redis's memory limit: maxmemory under noeviction everywhere Weir starts or deploys Redis,
and a gateway that refuses new work (503, Retry-After) before Redis is full, so what it
accepted is still answered.

Past maxmemory itself Redis refuses every write and every MULTI, the batcher's and workers'
answers included: accepted requests wait (their services retry) until memory is freed or the
limit raised, then are answered. The mesh tests fill Redis with a filler key so that the
limits sit far above the noise of its own bookkeeping.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from redis import Redis
from redis.exceptions import RedisError

from gateway.admission import ADMITTED, Admission
from tests.conftest import ROOT, Mesh, private_mesh, wait_until
from weir import names
from weir.cli import _overrides, _parser
from weir.embedded import Embedded
from weir.redis_io.link import Link
from weir.redis_server import RedisServer
from weir.settings import GatewaySettings
from weir.up_plan import UpPlan
from weir.up_settings import UpSettings

FILLER_BYTES = 16 * 1024 * 1024
URL = "/v2/models/tiny_mlp/infer"
ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


def test_a_private_redis_runs_with_its_maxmemory_under_noeviction() -> None:
    with RedisServer(maxmemory="48mb") as server, Redis(port=server.port) as client:
        assert client.config_get("maxmemory") == {"maxmemory": str(48 * 1024 * 1024)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}


def up_redis_maxmemory(settings: UpSettings) -> str:
    """The maxmemory ``weir up`` would start its Redis with."""
    redis = Embedded(UpPlan.of(settings)).redis
    redis.stop()  # never started: only its temporary directory to remove
    return redis.maxmemory


def test_weir_up_gives_its_redis_1gb_by_default_and_takes_the_flag() -> None:
    assert up_redis_maxmemory(UpSettings()) == "1gb"
    options = _overrides(_parser().parse_args(["up", "--redis-maxmemory", "256mb"]))
    assert up_redis_maxmemory(UpSettings(**options)) == "256mb"
    with pytest.raises(ValueError, match="redis_maxmemory"):
        UpSettings(redis_maxmemory="lots")


def test_compose_and_kubernetes_run_redis_with_maxmemory_and_noeviction() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    command = compose["services"]["redis"]["command"]
    assert command[command.index("--maxmemory") + 1] == "${WEIR_REDIS_MAXMEMORY:-1gb}"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    (statefulset, _) = yaml.safe_load_all((ROOT / "deploy/k8s/redis.yaml").read_text())
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--maxmemory") + 1] == "1gb"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    # Above maxmemory: fragmentation, buffers and an AOF rewrite's fork are not counted in it.
    assert container["resources"]["limits"]["memory"] == "1536Mi"


def test_admission_past_maxmemory_raises_redis_oom_and_queues_nothing(
    redis_server: RedisServer,
) -> None:
    async def admit_twice() -> list[Any]:
        # memory_fraction 0: no gauge, Redis's own refusal is all there is.
        admission = Admission(Link(redis_server.url), memory_fraction=0)
        fields = {b"m": b"x" * 1024}
        try:
            first = await admission.enqueue("oom_model", "1", fields, 0)
            with Redis.from_url(redis_server.url) as client:
                client.config_set("maxmemory", 100_000)
            try:
                with pytest.raises(RedisError, match="maxmemory"):
                    await admission.enqueue("oom_model", "1", fields, 0)
            finally:
                with Redis.from_url(redis_server.url) as client:
                    client.config_set("maxmemory", 0)
            return [first, await admission.enqueue("oom_model", "1", fields, 0)]
        finally:
            await admission.link.close()

    assert asyncio.run(admit_twice()) == [ADMITTED, ADMITTED]
    with Redis.from_url(redis_server.url) as client:
        assert client.xlen(names.request_stream("oom_model", "1")) == 2
        assert client.get(names.queued_counter("oom_model", "1")) == b"2"


@pytest.fixture(scope="module")
def memory_mesh(tiny_repository: Path) -> Iterator[Mesh]:
    with private_mesh(tiny_repository) as running:
        yield running


@pytest.fixture
def filled(memory_mesh: Mesh) -> Iterator[Redis]:
    """Redis holding a 16 MiB filler key; maxmemory and the filler are undone after."""
    client = Redis.from_url(memory_mesh.redis_url)
    client.set("test-filler", b"f" * FILLER_BYTES)
    try:
        yield client
    finally:
        client.config_set("maxmemory", 0)
        client.delete("test-filler")
        client.close()


def queued(client: Redis) -> int:
    return int(client.get(names.queued_counter("tiny_mlp", "1")) or 0)


async def send_until_refused(
    http: httpx.AsyncClient, client: Redis, held: list[asyncio.Future[httpx.Response]]
) -> httpx.Response:
    """Send requests one at a time until one is refused; those admitted join ``held``."""
    for _ in range(20):
        task = asyncio.ensure_future(http.post(URL, json=ROW))
        await asyncio.to_thread(answered_or_queued, task, client, queued(client) + 1)
        if task.done():
            return task.result()
        held.append(task)
    pytest.fail("no request was refused")


def answered_or_queued(task: asyncio.Future[httpx.Response], client: Redis, count: int) -> None:
    wait_until(lambda: task.done() or queued(client) >= count, 10, "an answer or a queued request")


async def hold_then_limit(mesh: Mesh, client: Redis, share: float) -> tuple[Any, list[Any]]:
    """Two requests wait on a stopped worker; maxmemory is set to used / ``share``; requests
    are sent until one is refused; maxmemory is lifted and the worker resumes."""
    worker = mesh.processes["worker"]
    held: list[asyncio.Future[httpx.Response]] = []
    async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as http:
        assert (await http.post(URL, json=ROW)).status_code == 200
        worker.send_signal(signal.SIGSTOP)
        try:
            published = _last_batch(client)
            held.extend(asyncio.ensure_future(http.post(URL, json=ROW)) for _ in range(2))
            await asyncio.to_thread(wait_until, lambda: queued(client) >= 2, 10, "2 queued")
            # The batcher has handed a batch on before the limit: Redis will not refuse that,
            # only the answer. (Delivered or not: a read the worker had sent before it was
            # stopped may take it.)
            await asyncio.to_thread(
                wait_until, lambda: _last_batch(client) > published, 10, "a new batch"
            )
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory", int(used / share))
            refused = await send_until_refused(http, client, held)
        finally:
            worker.send_signal(signal.SIGCONT)
        if share > 1:  # past maxmemory: nothing can be answered until it is lifted
            await asyncio.to_thread(wait_until, lambda: _worker_holds_batch(client), 10, "batch")
            assert not any(task.done() for task in held)
            client.config_set("maxmemory", 0)
        answered = await asyncio.gather(*held)
    return refused, [r.status_code for r in answered]


def _last_batch(client: Redis) -> tuple[int, ...]:
    """The id of the last batch the batcher published (trimming does not move it)."""
    return _id(client.xinfo_stream(names.batch_stream("tiny_mlp", "1"))["last-generated-id"])


def _id(entry_id: bytes) -> tuple[int, ...]:
    return tuple(int(part) for part in entry_id.split(b"-"))


def _worker_holds_batch(client: Redis) -> bool:
    """The worker has read a tiny_mlp batch it cannot answer (its transaction is refused)."""
    pending = client.xpending(names.batch_stream("tiny_mlp", "1"), "workers")
    return bool(pending["pending"])


def test_near_maxmemory_new_requests_get_503_and_the_accepted_are_answered(
    memory_mesh: Mesh, filled: Redis
) -> None:
    # Used memory at 90% of maxmemory: past the gateway's 80%, short of Redis's own limit.
    refused, statuses = asyncio.run(hold_then_limit(memory_mesh, filled, 0.9))
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert "WEIR_GATEWAY_ADMISSION_MEMORY_FRACTION" in error, error
    assert statuses == [200] * len(statuses) and len(statuses) >= 2


def test_past_maxmemory_requests_get_503_and_the_accepted_wait_for_room(
    memory_mesh: Mesh, filled: Redis
) -> None:
    refused, statuses = asyncio.run(hold_then_limit(memory_mesh, filled, 2.0))
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert "maxmemory" in refused.json()["error"]
    assert statuses == [200] * len(statuses) and len(statuses) >= 2


def test_the_gateway_admits_up_to_80_percent_of_maxmemory_by_default() -> None:
    assert GatewaySettings().admission_memory_fraction == 0.8


def test_on_a_cluster_each_primary_has_its_own_gauge(redis_cluster: Any) -> None:
    """A primary near its maxmemory refuses its models' requests; another primary's models
    are admitted, whichever was read last (each INFO goes to the model's own primary)."""
    from gateway.admission import NO_MEMORY
    from weir.redis_io.cluster_link import ClusterLink

    full_node, roomy = None, None
    for i in range(64):  # two models whose keys lie on different primaries
        node = redis_cluster.primary_of(names.serving_versions(f"gauge_{i}"))
        if full_node is None:
            full_node, full = node, f"gauge_{i}"
        elif node.port != full_node.port:
            roomy = f"gauge_{i}"
            break
    assert full_node is not None and roomy is not None
    with Redis(port=full_node.port) as client:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", int(used / 0.9))  # past the 0.8 admission may fill

    async def admit() -> list[int]:
        admission = Admission(ClusterLink(redis_cluster.url), memory_fraction=0.8)
        fields = {b"m": b"x" * 64}
        await admission.link.connect()  # the slot map: until it is known nothing is read
        try:
            # The first request of each primary is admitted: its read rides on its flush.
            return [
                await admission.enqueue(full, "1", fields, 0),
                await admission.enqueue(roomy, "1", fields, 0),
                await admission.enqueue(full, "1", fields, 0),
                await admission.enqueue(roomy, "1", fields, 0),
            ]
        finally:
            await admission.link.close()

    try:
        assert asyncio.run(admit()) == [ADMITTED, ADMITTED, NO_MEMORY, ADMITTED]
    finally:
        with Redis(port=full_node.port) as client:
            client.config_set("maxmemory", 0)
        for model in (full, roomy):  # the session's cluster keeps no queue of these
            keys = (names.request_stream(model, "1"), names.queued_counter(model, "1"))
            with Redis(port=redis_cluster.primary_of(keys[0]).port) as client:
                client.delete(*keys)
