"""Nothing finished stays in Redis, and a readiness probe costs what the live workers do.

A pipeline request's route hash is gone once it is answered; a reply never brings back the
reply stream of a gateway that stopped; a killed gateway's stream is removed by a live one;
readiness probes send no ``SCAN`` and a burst of them shares one read. The mesh runs the
python models and the ``combo`` pipeline of tests/pipelines/test_route_mesh.py on its own
redis-server, with a 1 s heartbeat TTL so that dead gateways are found quickly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import redis

from tests.conftest import ROOT, Mesh, http_ready, private_mesh, wait_until
from tests.pipelines.test_route_mesh import write_model, write_pipeline
from weir import names, wire
from weir.redis_server import free_port
from weir.tensors import Tensor
from weir.wire import InferRequest

TTL_S = 1.0
# A dead gateway's stream goes once its beat expired a TTL ago, at the next sweep (TTL / 3).
SWEPT_WITHIN_S = 2 * TTL_S + TTL_S / 3 + 5.0
PROBES = 600


@pytest.fixture(scope="module")
def leftovers_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("leftovers-models")
    write_model(root, "double", ["X"], ["Y"])
    write_model(root, "square", ["X"], ["Y"])
    write_model(root, "add", ["A", "B"], ["S"])
    write_pipeline(root)
    with private_mesh(root, {"WEIR_HEARTBEAT_TTL_S": str(TTL_S)}) as running:
        yield running


@pytest.fixture
def client(leftovers_mesh: Mesh) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(leftovers_mesh.redis_url) as connection:
        yield connection


def body(value: float) -> dict[str, object]:
    return {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]}


def route_keys(client: redis.Redis) -> list[bytes]:
    return list(client.keys(names.route_state("*")))


def gateways(client: redis.Redis) -> set[str]:
    return {g.decode() for g in client.hkeys(names.live_values(names.GATEWAY_GROUP))}


def start_gateway(mesh: Mesh) -> subprocess.Popen[bytes]:
    """One more gateway process on the mesh, started the way start_mesh starts one."""
    port = free_port()
    env = {
        **os.environ,
        "WEIR_REDIS_URL": mesh.redis_url,
        "WEIR_REPOSITORY": str(mesh.repository),
        "WEIR_HEARTBEAT_TTL_S": str(TTL_S),
        "WEIR_GATEWAY_HOST": "127.0.0.1",
        "WEIR_GATEWAY_HTTP_PORT": str(port),
        "WEIR_GATEWAY_METRICS_PORT": "0",
        "WEIR_GATEWAY_GRPC_PORT": "0",
    }
    command = [sys.executable, "-m", "weir.cli", "gateway"]
    process = subprocess.Popen(command, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    wait_until(lambda: http_ready(url) or process.poll() is not None, 60, "the gateway")
    assert process.poll() is None, "the gateway exited at start"
    return process


def new_gateway(mesh: Mesh, client: redis.Redis) -> tuple[subprocess.Popen[bytes], str]:
    """A started gateway and its id, the one the registry did not hold before."""
    before = gateways(client)
    process = start_gateway(mesh)
    wait_until(lambda: gateways(client) - before, 5, "the new gateway's heartbeat")
    (gateway_id,) = gateways(client) - before
    return process, gateway_id


def queue_for(client: redis.Redis, reply_to: str, deadline_ms: int) -> None:
    """Queue a ``double`` request answering to ``reply_to`` as a gateway's admission does."""
    x = Tensor.from_numpy(np.ones((1, 4), dtype=np.float32))
    request = InferRequest(
        f"late-{deadline_ms}", "double", "1", {"X": x}, reply_to, deadline_ms, ["Y"]
    )
    with client.pipeline(transaction=True) as pipe:
        pipe.xadd(names.request_stream("double", "1"), wire.request_fields(request, 1))
        pipe.incr(names.queued_counter("double", "1"))
        pipe.execute()


def answered(client: redis.Redis) -> bool:
    """The worker or the batcher answered every queued ``double`` request (same transaction)."""
    return int(client.get(names.queued_counter("double", "1")) or 0) == 0


def test_a_pipeline_request_leaves_no_route_state(
    leftovers_mesh: Mesh, client: redis.Redis
) -> None:
    url = f"{leftovers_mesh.url}/v2/models/combo/infer"
    for value in (1.0, 2.0, 3.0):
        response = httpx.post(url, json=body(value), timeout=30)
        assert response.status_code == 200, response.text
    failed = httpx.post(url, json=body(1e5), timeout=30)  # add refuses A over 1e5
    assert failed.status_code == 500, failed.text

    wait_until(lambda: route_keys(client) == [], 1.0, "no route hash left")


def test_a_stopped_gateways_stream_is_not_made_again_by_a_late_reply(
    leftovers_mesh: Mesh, client: redis.Redis
) -> None:
    gateway, gateway_id = new_gateway(leftovers_mesh, client)
    stream = names.reply_stream(gateway_id)
    assert client.exists(stream), "a gateway makes its reply stream at start"

    gateway.send_signal(signal.SIGTERM)
    assert gateway.wait(20) == 0
    assert not client.exists(stream)
    assert gateway_id not in gateways(client), "a stopped gateway leaves the registry"

    now_ms = wire.now_ns() // 1_000_000
    queue_for(client, stream, now_ms + 30_000)  # answered by a worker
    queue_for(client, stream, now_ms - 1)  # answered by the batcher: already expired
    wait_until(lambda: answered(client), 10, "the late requests to be answered")
    assert not client.exists(stream)


def test_a_killed_gateways_stream_is_removed_by_a_live_gateway(
    leftovers_mesh: Mesh, client: redis.Redis
) -> None:
    gateway, gateway_id = new_gateway(leftovers_mesh, client)
    stream = names.reply_stream(gateway_id)
    assert client.exists(stream)

    gateway.kill()
    gateway.wait()

    wait_until(lambda: not client.exists(stream), SWEPT_WITHIN_S, "the killed gateway's stream")
    assert gateway_id not in gateways(client)


def test_a_gateway_makes_its_lost_stream_again(leftovers_mesh: Mesh, client: redis.Redis) -> None:
    (gateway_id,) = gateways(client)  # the mesh's own gateway; the others are gone
    stream = names.reply_stream(gateway_id)
    client.delete(stream)  # as a Redis that restarted without its data

    wait_until(lambda: client.exists(stream), 5 * TTL_S, "the gateway to make its stream again")
    response = httpx.post(f"{leftovers_mesh.url}/v2/models/double/infer", json=body(2.0))
    assert response.status_code == 200, response.text


def command_calls(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}


async def probe_burst(url: str, count: int) -> list[int]:
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        responses = await asyncio.gather(*(http.get(url) for _ in range(count)))
    return [response.status_code for response in responses]


def test_readiness_probes_send_no_scan_and_share_their_reads(
    leftovers_mesh: Mesh, client: redis.Redis
) -> None:
    for chunk in range(10):
        client.mset({f"unrelated:{chunk}:{i}": b"x" for i in range(1000)})
    before = command_calls(client)
    started = time.monotonic()

    statuses = asyncio.run(probe_burst(f"{leftovers_mesh.url}/v2/health/ready", PROBES))

    took_s = time.monotonic() - started
    after = command_calls(client)
    assert statuses == [200] * PROBES
    assert after.get("scan", 0) == before.get("scan", 0)
    # The services beat and reclaim meanwhile (script calls too): their share is counted
    # over an idle window as long as the burst (a measurement, not a wait).
    time.sleep(took_s)
    idle = command_calls(client)
    reads = after.get("evalsha", 0) - before.get("evalsha", 0)
    background = idle.get("evalsha", 0) - after.get("evalsha", 0)
    assert reads - background < PROBES / 4, f"{reads} script calls ({background} idle)"


def test_an_expired_consumer_leaves_the_registry_at_the_next_read(
    leftovers_mesh: Mesh, client: redis.Redis
) -> None:
    """A worker's beat that expired counts for nothing, and the next read drops it."""
    client.hset(names.live_values(names.WORKER_GROUP), "ghost", b"[]")
    client.zadd(names.live_expiry(names.WORKER_GROUP), {"ghost": 1})

    wait_until(
        lambda: not client.hexists(names.live_values(names.WORKER_GROUP), "ghost"),
        5,
        "the expired consumer to leave the registry",
    )
    assert not client.zscore(names.live_expiry(names.WORKER_GROUP), "ghost")
