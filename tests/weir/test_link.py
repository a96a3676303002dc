"""The hot-path Redis connection against a real redis-server: pipelines, transactions,
errors as values, concurrent callers, a lost connection, a password and a database."""

from __future__ import annotations

import asyncio
import enum
import random
import signal
import struct
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from weir.redis_io.link import Link, pack, pack_each
from weir.redis_server import RedisServer

T = TypeVar("T")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return uvloop.run(coroutine)


def test_pack_is_resp() -> None:
    assert pack([("SET", b"k", 1), ("GET", "k")]) == (
        b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    )
    with pytest.raises(TypeError, match="NoneType"):
        pack([("SET", "k", None)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="bool"):
        pack([("SET", "k", True)])


def test_pack_in_c_sends_the_bytes_of_the_general_path() -> None:
    rng = random.Random(7)

    def arg() -> bytes | str | int | float:
        kind = rng.randrange(5)
        if kind == 0:
            return rng.randrange(-(2**70), 2**70)
        if kind == 1:
            return float(struct.unpack("d", rng.randbytes(8))[0])  # NaN, inf, subnormals too
        if kind == 2:
            return rng.random() * 10 ** rng.randrange(-30, 30)
        if kind == 3:
            return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(6)))
        return rng.randbytes(rng.randrange(6))

    for _ in range(3000):
        commands = [tuple(arg() for _ in range(rng.randrange(1, 6))) for _ in range(3)]
        assert pack(commands) == pack_each(commands)
    # What the C path refuses takes the general one: lists, an IntEnum, a generator.
    listed = [["XADD", "s", "*", "credits", 2], ("GET", Credits.TWO)]
    assert pack(listed) == pack_each(listed) == pack(iter(listed))
    assert b"$1\r\n2\r\n" in pack([("GET", Credits.TWO)])


class Credits(enum.IntEnum):
    TWO = 2


def test_a_pipeline_answers_in_order_with_errors_as_values(server: RedisServer) -> None:
    async def scenario() -> list[object]:
        link = Link(server.url)
        try:
            return await link.call(
                ("SET", "k", b"v\x00\xff"), ("GET", "k"), ("INCR", "n"), ("LPUSH", "k", "x")
            )
        finally:
            await link.close()

    ok, value, count, wrong_type = run(scenario())
    assert (ok, value, count) == (b"OK", b"v\x00\xff", 1)
    assert isinstance(wrong_type, ResponseError) and "WRONGTYPE" in str(wrong_type)


def test_a_transaction_returns_results_and_raises_what_failed(server: RedisServer) -> None:
    async def scenario() -> tuple[list[object], str]:
        link = Link(server.url)
        try:
            results = await link.transaction(("SET", "a", "1"), ("INCRBY", "a", 2))
            with pytest.raises(ResponseError) as failed:
                await link.transaction(("SET", "s", "text"), ("INCR", "s"))
            return results, str(failed.value)
        finally:
            await link.close()

    results, message = run(scenario())
    assert results == [b"OK", 3]
    assert "not an integer" in message
    # As in MULTI/EXEC: the command that failed at run time did not undo the others.
    assert redis.Redis.from_url(server.url).get("s") == b"text"


def test_concurrent_callers_share_one_connection(server: RedisServer) -> None:
    async def scenario() -> tuple[list[list[Any]], int]:
        link = Link(server.url)
        try:
            replies = await asyncio.gather(
                *(link.call(("INCR", "shared"), ("GET", "shared")) for _ in range(200))
            )
            return replies, len(redis.Redis.from_url(server.url).client_list())
        finally:
            await link.close()

    replies, clients = run(scenario())
    assert sorted(r[0] for r in replies) == list(range(1, 201))
    assert all(int(r[1]) == r[0] for r in replies)  # each pipeline's two replies stay together
    assert clients == 2  # the link's one connection and the checking client's


def test_a_lost_connection_fails_what_waits_and_the_next_call_reconnects(
    server: RedisServer,
) -> None:
    async def scenario() -> tuple[BaseException | None, list[object]]:
        link = Link(server.url)
        blocked = asyncio.ensure_future(link.call(("BLPOP", "never", 0)))
        await asyncio.sleep(0.2)
        redis.Redis.from_url(server.url).client_kill_filter(_type="normal", skipme=True)
        try:
            await blocked
            error = None
        except RedisConnectionError as exc:
            error = exc
        again = await link.call(("PING",))
        await link.close()
        return error, again

    error, again = run(scenario())
    assert isinstance(error, RedisConnectionError)
    assert again == [b"PONG"]


def test_redis_down_is_a_connection_error() -> None:
    with RedisServer() as stopped:
        url = stopped.url
    with pytest.raises(RedisConnectionError, match="cannot connect"):
        run(Link(url).call(("PING",)))


def test_password_and_database_come_from_the_url(server: RedisServer) -> None:
    admin = redis.Redis.from_url(server.url)
    admin.config_set("requirepass", "s3cret")
    authed = redis.Redis(host="127.0.0.1", port=server.port, password="s3cret", db=3)

    async def scenario(url: str) -> list[object]:
        link = Link(url)
        try:
            return await link.call(("SET", "where", "db3"))
        finally:
            await link.close()

    assert run(scenario(f"redis://:s3cret@127.0.0.1:{server.port}/3")) == [b"OK"]
    assert authed.get("where") == b"db3"
    with pytest.raises(RedisConnectionError, match="refused"):
        run(scenario(f"redis://:wrong@127.0.0.1:{server.port}/0"))


def test_a_silent_redis_times_out_and_the_link_reconnects_after(server: RedisServer) -> None:
    # SIGSTOP: the connection stays open and nothing answers, as with a half-open socket.
    assert server.process is not None

    async def scenario() -> tuple[str, list[object]]:
        link = Link(server.url, reply_timeout_s=0.3)
        await link.call(("PING",))
        server.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            started = time.monotonic()
            with pytest.raises(RedisConnectionError) as silent:
                await link.call(("PING",))
            assert time.monotonic() - started < 2
        finally:
            server.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        again = await link.call(("PING",))
        await link.close()
        return str(silent.value), again

    message, again = run(scenario())
    assert "did not answer within 0.3 s" in message
    assert again == [b"PONG"]


def test_a_blocking_read_may_wait_its_block_time(server: RedisServer) -> None:
    async def scenario() -> list[object]:
        link = Link(server.url, reply_timeout_s=0.2)
        try:
            # XREAD BLOCK 500 answers nil after 0.5 s: longer than the reply timeout alone.
            return await link.call(("XREAD", "BLOCK", 500, "STREAMS", "empty", "$"), block_s=0.5)
        finally:
            await link.close()

    assert run(scenario()) == [None]
