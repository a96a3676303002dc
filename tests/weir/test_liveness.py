"""The liveness registry: a beat keeps a consumer live for its TTL; ``prolong`` only extends."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis
from redis.asyncio import Redis

from tests.conftest import RedisServer
from weir.liveness import Heartbeat, live_consumers, prolong


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    connection = Redis.from_url(redis_server.url)
    yield connection
    await connection.aclose()


@pytest.fixture
def sync_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_server.url) as connection:
        yield connection


async def test_prolong_keeps_a_registered_consumer_live_past_its_beat(
    client: Redis, sync_client: redis.Redis
) -> None:
    group = f"g-{uuid.uuid4().hex}"
    beat = Heartbeat(client, group, "stalled", 0.0, lambda: b"[]")  # lapses at once
    await beat.beat()
    prolong(sync_client, group, "stalled", 60.0)
    assert await live_consumers(client, group) == {"stalled": b"[]"}


async def test_prolong_does_not_revive_a_consumer_whose_beat_lapsed(
    client: Redis, sync_client: redis.Redis
) -> None:
    group = f"g-{uuid.uuid4().hex}"
    beat = Heartbeat(client, group, "gone", 0.0, lambda: b"[]")
    await beat.beat()
    assert await live_consumers(client, group) == {}  # read once lapsed: dropped
    prolong(sync_client, group, "gone", 60.0)
    prolong(sync_client, group, "never-registered", 60.0)
    assert await live_consumers(client, group) == {}
