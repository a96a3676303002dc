"""--redis-url for Sentinel: parsed, and every client reaches the primary it names."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tests.replicated_redis import SentinelSet
from weir.redis_io.connection import connect, connect_sync
from weir.redis_io.link import Link
from weir.redis_io.redis_target import parse


def test_plain_urls_pass_through() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://u:p@h:6380/2", "unix:///run/r.sock"):
        target = parse(url)
        assert target.url == url and not target.is_sentinel


def test_sentinel_url() -> None:
    target = parse(
        "redis+sentinel://app:secret@s1:5000,s2,[::1]:5002/mymaster/3"
        "?sentinel_password=spw&socket_timeout=2"
    )
    assert target.sentinels == (("s1", 5000), ("s2", 26379), ("::1", 5002))
    assert target.service == "mymaster"
    assert target.sentinel_auth == {"sentinel_password": "spw"}
    # The servers' URL keeps their credentials, database and options, not the Sentinels'.
    assert target.url == "redis://app:secret@sentinel-primary:6379/3?socket_timeout=2"
    assert parse("rediss+sentinel://s1/m").url == "rediss://sentinel-primary:6379/0"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379", "must name the service"),
        ("redis+sentinel://s1/m/x/y", "must name the service"),
        ("redis+sentinel://s1/m/zero", "has database 'zero'"),
        ("redis+sentinel://s1:port/m", "bad port"),
        ("redis+sentinel:///m", "names no Sentinel host"),
    ],
)
def test_bad_sentinel_urls_say_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse(url)


def test_errors_hide_the_password() -> None:
    with pytest.raises(ValueError) as raised:
        parse("redis+sentinel://app:hunter2@s1")
    assert "hunter2" not in str(raised.value) and "app:***@s1" in str(raised.value)


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelSet]:
    with SentinelSet() as running:
        yield running


def test_every_client_reaches_the_primary_sentinel_names(sentinel: SentinelSet) -> None:
    async def check() -> None:
        link = Link(sentinel.url, identify=True)
        assert await link.call(("SET", "k", "link"), ("ROLE",)) == [
            b"OK",
            [b"master", *(await link.call(("ROLE",)))[0][1:]],
        ]
        assert link.server_id is not None and len(link.server_id) == 40
        client = connect(sentinel.url)
        assert await client.get("k") == b"link"
        await client.aclose()
        await client.connection_pool.sentinel_manager.aclose()  # type: ignore[attr-defined]
        await link.close()
        lost = Link(sentinel.url.replace("/weir", "/nosuch"))
        with pytest.raises(RedisConnectionError, match="'nosuch'"):
            await lost.call(("PING",))

    asyncio.run(check())
    with connect_sync(sentinel.url) as client:
        assert client.get("k") == b"link"
        for peer in client.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            peer.close()


def test_a_write_to_a_replica_drops_the_connection(sentinel: SentinelSet) -> None:
    """A link left on a demoted primary finds the new one: READONLY closes its connection."""

    async def check() -> None:
        link = Link(sentinel.replica.url)
        (reply,) = await link.call(("SET", "k", "v"))
        assert isinstance(reply, ResponseError) and str(reply).startswith("READONLY")
        assert link._protocol is not None and link._protocol.closed
        assert await link.call(("PING",)) == [b"PONG"]  # a new connection
        await link.close()

    asyncio.run(check())
