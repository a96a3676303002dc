"""The gateway's reply reader survives whatever its reply stream holds.

Anything can be written to a Redis stream. An entry that is not a reply is logged and
skipped; a malformed reply that names a waiting request answers it at once with a 500
(rather than leaving it to its deadline); a reader whose reads fail makes the gateway not
ready until a read succeeds again, and never stops reading.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgpack
import pytest
import redis

from tests.conftest import Mesh, http_ready, private_mesh, wait_queued, wait_until
from weir import names, wire
from weir.wire import InferRequest

ROW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


@pytest.fixture(scope="module")
def mesh(tiny_repository: Path) -> Iterator[Mesh]:
    with private_mesh(tiny_repository) as running:
        yield running


@pytest.fixture
def client(mesh: Mesh) -> Iterator[redis.Redis]:
    connection = redis.Redis.from_url(mesh.redis_url)
    yield connection
    connection.close()


def reply_stream(client: redis.Redis) -> bytes:
    (stream,) = client.keys(names.reply_stream("*"))  # one gateway process
    return bytes(stream)


def infer(mesh: Mesh) -> httpx.Response:
    return httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=ROW, timeout=30)


def packed(value: object) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def test_garbage_in_the_reply_stream_is_skipped_and_the_gateway_answers_on(
    mesh: Mesh, client: redis.Redis
) -> None:
    stream = reply_stream(client)
    garbage: list[dict[bytes, bytes]] = [
        {b"not-a-payload": b"1"},
        {wire.PAYLOAD: b"\xc1\xff not msgpack"},
        {wire.PAYLOAD: packed({"a": "map, not a list"})},
        {wire.PAYLOAD: packed([b"\xc1", 7, None, [1, 2], {"id": ["unhashable"]}])},
        {wire.PAYLOAD: packed([packed({"id": "no-such-request", "outputs": 3})])},
        {wire.PAYLOAD: packed([packed({"id": 12, "model": "m", "version": "1"})])},
    ]
    for fields in garbage:
        client.xadd(stream, fields)  # type: ignore[arg-type]
    for _ in range(3):
        assert infer(mesh).status_code == 200
    assert http_ready(f"{mesh.url}/v2/health/ready")
    assert mesh.processes["gateway"].poll() is None


def queued_request_id(client: redis.Redis) -> str:
    """The id of the tiny_mlp request queued last: the newest entry of its request stream."""
    ((_, fields),) = client.xrevrange(names.request_stream("tiny_mlp", "1"), count=1)
    return InferRequest.decode(fields[wire.PAYLOAD]).id


async def malformed_reply_then_resume(mesh: Mesh, client: redis.Redis) -> httpx.Response:
    worker = mesh.processes["worker"]
    async with httpx.AsyncClient(timeout=60) as http:
        worker.send_signal(signal.SIGSTOP)
        try:
            waiting = asyncio.ensure_future(
                http.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=ROW)
            )
            await asyncio.to_thread(wait_queued, mesh, 1)
            request_id = await asyncio.to_thread(queued_request_id, client)
            reply = packed({"id": request_id, "model": "tiny_mlp", "outputs": "not tensors"})
            client.xadd(reply_stream(client), {wire.PAYLOAD: packed([reply])})
            # Answered while the worker is still stopped: not left to its deadline.
            answered = await asyncio.wait_for(waiting, 10)
        finally:
            worker.send_signal(signal.SIGCONT)
    return answered


def test_a_malformed_reply_to_a_waiting_request_answers_it_with_500_at_once(
    mesh: Mesh, client: redis.Redis
) -> None:
    response = asyncio.run(malformed_reply_then_resume(mesh, client))
    assert response.status_code == 500
    assert "malformed reply" in response.json()["error"]
    # The worker's real reply, once it resumes, finds nobody waiting: answered once only.
    wait_until(
        lambda: int(client.get(names.queued_counter("tiny_mlp", "1")) or 0) == 0,
        30,
        "the resumed worker to answer the queued request",
    )
    assert infer(mesh).status_code == 200


def test_a_failing_reply_reader_makes_the_gateway_unready_until_it_reads_again(
    mesh: Mesh, client: redis.Redis
) -> None:
    stream = reply_stream(client)
    ready = f"{mesh.url}/v2/health/ready"
    assert http_ready(ready)
    # A string where the stream was: every XREAD now fails with WRONGTYPE.
    client.delete(stream)
    client.set(stream, b"not a stream")
    wait_until(lambda: not http_ready(ready), 10, "the gateway to say it is not ready")
    assert httpx.get(f"{mesh.url}/v2/health/live", timeout=5).status_code == 200
    # Gone again: the gateway makes its stream anew, the reader reads, ready once more.
    client.delete(stream)
    wait_until(lambda: http_ready(ready), 15, "the gateway to be ready again")
    assert infer(mesh).status_code == 200
    assert mesh.processes["gateway"].poll() is None
