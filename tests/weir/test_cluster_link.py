"""The hot-path link on a real Redis Cluster: runs per node in order, one-slot transactions,
MOVED and ASK followed, blocking reads on connections of their own, and a failover."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis
import uvloop
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from tests.redis_cluster import ClusterSet
from weir.redis_io.cluster_link import MAX_RETRIES, ClusterLink, parse_cluster_url
from weir.redis_io.cluster_slots import command_keys, node_url, slot_of, split_units
from weir.redis_io.link import Link

T = TypeVar("T")

# Busy for a few tens of milliseconds, then the server's time: (seconds, microseconds).
SPIN_SCRIPT = """
local n = 0
for i = 1, tonumber(ARGV[1]) do n = n + i end
return redis.call('TIME')
"""
NOW_SCRIPT = "return redis.call('TIME')"


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return uvloop.run(coroutine)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterSet]:
    with ClusterSet() as running:
        yield running


def tags(cluster: ClusterSet, prefix: str) -> dict[int, list[str]]:
    """Hash tags ``{prefix-i}`` by the port of the primary serving them, several each."""
    ranges = cluster.slots(cluster.live()[0].port)
    found: dict[int, list[str]] = {}
    for i in range(200):
        tag = f"{{{prefix}-{i}}}"
        slot = slot_of(tag)
        port = next(p for first, last, p in ranges if first <= slot <= last)
        found.setdefault(port, []).append(tag)
    assert len(found) == 3 and all(len(some) >= 3 for some in found.values())
    return found


def spread(cluster: ClusterSet, prefix: str) -> list[str]:
    """One hash tag on each of the three primaries."""
    return [some[0] for _, some in sorted(tags(cluster, prefix).items())]


def shard_fetches(cluster: ClusterSet) -> int:
    """How many times the live nodes were asked ``CLUSTER SHARDS``."""
    stats = [cluster.info(n.port, "commandstats") for n in cluster.live()]
    return sum(s.get("cmdstat_cluster|shards", {}).get("calls", 0) for s in stats)


def begin_migration(cluster: ClusterSet, slot: int, source: int, target: int) -> None:
    cluster.command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
    cluster.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))


def migrate(cluster: ClusterSet, source: int, target: int, *keys: str) -> None:
    cluster.command(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)


def end_migration(cluster: ClusterSet, slot: int, source: int, target: int) -> None:
    """Move what is left of ``slot`` and tell every primary that ``target`` serves it."""
    left = cluster.command(source, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
    if left:
        migrate(cluster, source, target, *(key.decode() for key in left))
    target_id = cluster.node_id(target)
    primaries = {port for _, _, port in cluster.slots(target)}
    for port in [target, source, *(primaries - {target, source})]:
        cluster.command(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    cluster.wait(
        lambda: all(_serves(cluster, n.port, slot, target) for n in cluster.live()),
        10,
        f"every node to see slot {slot} on port {target}",
    )


def _serves(cluster: ClusterSet, port: int, slot: int, target: int) -> bool:
    return any(first <= slot <= last and p == target for first, last, p in cluster.slots(port))


def asking_get(port: int, key: str) -> Any:
    """GET on the node importing ``key``'s slot (which redirects any other client)."""
    with redis.Redis(port=port) as client:
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.get(key)
        return pipe.execute()[1]


def test_the_url_names_startup_nodes_and_a_template_for_each_node() -> None:
    nodes, template = parse_cluster_url(
        "rediss+cluster://app:s%40cret@n1:7000,n2,[::1]:7002/0?ssl_cert_reqs=none&ssl_ca_certs=/ca"
    )
    assert nodes == [("n1", 7000), ("n2", 6379), ("::1", 7002)]
    assert (
        template == "rediss://app:s%40cret@cluster-node:6379/0?ssl_cert_reqs=none&ssl_ca_certs=/ca"
    )
    assert parse_cluster_url("redis+cluster://n1") == (
        [("n1", 6379)],
        "redis://cluster-node:6379/0",
    )
    # Each node's Link reads the template's credentials and TLS options at its own address.
    options = Link(node_url(template, ("::1", 7002))).options
    assert (options["host"], options["port"], options["password"]) == ("::1", 7002, "s@cret")
    assert options["ssl_cert_reqs"] == "none" and options["ssl_ca_certs"] == "/ca"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://n1/1", "has only 0"),
        ("redis+cluster://n1:port", "bad port"),
        ("redis+cluster:///0", "names no cluster node"),
        ("redis://n1", "no redis\\+cluster"),
        ("redis+cluster://app:hunter2@n1/2", "app:\\*\\*\\*@n1"),
    ],
)
def test_bad_cluster_urls_say_what_is_wrong_without_the_password(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as raised:
        parse_cluster_url(url)
    assert "hunter2" not in str(raised.value)


def test_keys_and_slots_of_commands() -> None:
    # Redis's own examples: a key's slot, and a hash tag keeping keys together.
    assert slot_of("foo") == 12182
    assert slot_of("{user1000}.following") == slot_of("{user1000}.followers")
    assert slot_of("foo{}{bar}") == 8363 != slot_of("bar")  # an empty tag: the whole key
    assert slot_of("foo{{bar}}zap") == slot_of("{bar")
    assert command_keys(("EVAL", "script", 2, "k1", "k2", "arg")) == ["k1", "k2"]
    read = ("XREADGROUP", "GROUP", "g", "c", "COUNT", 5, "STREAMS", "a", "b", ">", ">")
    assert command_keys(read) == ["a", "b"]
    assert command_keys(("XGROUP", "CREATE", "s", "g", "$")) == ["s"]
    assert command_keys(("DEL", "a", "b", "c")) == ["a", "b", "c"]
    assert command_keys(("PING",)) == []
    units = split_units([("SET", "{t}a", 1), ("MULTI",), ("INCR", "{t}b"), ("EXEC",), ("PING",)])
    assert [(len(u.commands), u.slot) for u in units] == [
        (1, slot_of("t")),
        (3, slot_of("t")),
        (1, None),
    ]
    with pytest.raises(ValueError, match="different Redis Cluster slots"):
        split_units([("MULTI",), ("INCR", "{a}x"), ("INCR", "{b}x"), ("EXEC",)])
    with pytest.raises(ValueError, match="must end"):
        split_units([("MULTI",), ("INCR", "{a}x")])


def test_every_key_has_the_slot_redis_py_gives_it() -> None:
    rng = random.Random(7)
    alphabet = b"ab{}:-_\x00\xff9"
    keys = [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(3000)]
    keys += [b"weir:{tiny_mlp}:1:requests", "{é}x".encode(), b"{", b"}{", b"{}", b"a{b}c{d}"]
    assert [slot_of(k) for k in keys] == [key_slot(k) for k in keys]
    assert slot_of("weir:{m}:1") == slot_of(b"m") == key_slot(b"m")


def test_a_pipeline_across_the_primaries_answers_in_order(cluster: ClusterSet) -> None:
    a, b, c = spread(cluster, "order")

    async def scenario() -> list[Any]:
        link = ClusterLink(cluster.url)
        try:
            return await link.call(
                ("SET", f"{a}k", "a1"), ("SET", f"{b}k", "b1"), ("PING",), ("GET", f"{a}k"),
                ("SET", f"{c}k", "c1"), ("LPUSH", f"{b}k", "x"), ("GET", f"{b}k"),
                ("XADD", f"{c}s", "*", "f", "v"), ("XLEN", f"{c}s"), ("GET", f"{c}k"),
            )  # fmt: skip
        finally:
            await link.close()

    replies = run(scenario())
    assert replies[:5] == [b"OK", b"OK", b"PONG", b"a1", b"OK"]
    assert isinstance(replies[5], ResponseError) and "WRONGTYPE" in str(replies[5])
    assert replies[6] == b"b1" and replies[8:] == [1, b"c1"]
    assert cluster.command(cluster.primary_of(f"{b}k").port, "GET", f"{b}k") == b"b1"


def test_a_later_node_runs_its_commands_after_the_earlier_run_answered(
    cluster: ClusterSet,
) -> None:
    a, b, _ = spread(cluster, "after")

    async def scenario() -> list[Any]:
        link = ClusterLink(cluster.url)
        try:
            return await link.call(
                ("EVAL", SPIN_SCRIPT, 1, f"{a}spin", 4_000_000),
                ("EVAL", NOW_SCRIPT, 1, f"{b}now"),
            )
        finally:
            await link.close()

    (spun_s, spun_us), (now_s, now_us) = run(scenario())
    # Both servers read one clock: node b ran its script only once node a had finished.
    assert (int(now_s), int(now_us)) >= (int(spun_s), int(spun_us))


def test_transactions_stay_on_one_slot_and_cross_slot_commands_send_nothing(
    cluster: ClusterSet,
) -> None:
    a, b, _ = spread(cluster, "multi")

    async def scenario() -> list[Any]:
        link = ClusterLink(cluster.url)
        try:
            results = await link.transaction(("INCR", f"{a}x"), ("INCRBY", f"{a}y", 5))
            with pytest.raises(ValueError, match="different Redis Cluster slots"):
                await link.transaction(("SET", f"{a}z", 1), ("SET", f"{b}z", 2))
            with pytest.raises(ValueError, match="different Redis Cluster slots"):
                await link.call(("SET", f"{a}w", 1), ("DEL", f"{a}w", f"{b}w"))
            with pytest.raises(ResponseError, match="not an integer"):
                await link.transaction(("SET", f"{a}s", "text"), ("INCR", f"{a}s"))
            return results
        finally:
            await link.close()

    assert run(scenario()) == [1, 5]
    port_a = cluster.primary_of(f"{a}z").port
    assert cluster.command(port_a, "EXISTS", f"{a}z", f"{a}w") == 0  # nothing was sent
    assert cluster.command(cluster.primary_of(f"{b}z").port, "EXISTS", f"{b}z") == 0


def test_a_slot_moved_under_the_link_is_followed_and_the_map_fetched_once(
    cluster: ClusterSet,
) -> None:
    by_node = tags(cluster, "moved")
    source, target, _ = sorted(by_node)
    shared, moving, staying = by_node[source][:3]

    def move(tag: str) -> None:
        begin_migration(cluster, slot_of(tag), source, target)
        end_migration(cluster, slot_of(tag), source, target)

    async def scenario() -> tuple[list[list[Any]], list[Any], list[int]]:
        link = ClusterLink(cluster.url)
        try:
            await link.call(("SET", f"{moving}k", "v"), ("SET", f"{staying}k", "w"))
            move(shared)
            fetches = [shard_fetches(cluster)]
            # Concurrent callers meet MOVED together: one fetch of the map serves them all.
            together = await asyncio.gather(*(link.call(("INCR", f"{shared}n")) for _ in range(10)))
            fetches.append(shard_fetches(cluster))
            move(moving)
            # One run on the old owner: the first and last are refused (MOVED), not the middle.
            mixed = await link.call(
                ("INCR", f"{moving}n"), ("INCR", f"{staying}n"), ("GET", f"{moving}k")
            )
            fetches.append(shard_fetches(cluster))
            return together, mixed, fetches
        finally:
            await link.close()

    together, mixed, (before, after_together, after_mixed) = run(scenario())
    assert sorted(r[0] for r in together) == list(range(1, 11))
    assert after_together - before == 1
    assert mixed == [1, 1, b"v"]
    assert after_mixed - after_together == 1
    # Each command ran once: the one not refused was not sent again with the others.
    assert cluster.command(target, "GET", f"{moving}n") == b"1"
    assert cluster.command(source, "GET", f"{staying}n") == b"1"


def test_ask_during_a_migration_is_followed_without_changing_the_map(
    cluster: ClusterSet,
) -> None:
    by_node = tags(cluster, "ask")
    source, target, _ = sorted(by_node)
    tag = by_node[source][0]
    slot = slot_of(tag)
    cluster.command(source, "MSET", f"{tag}here", "1", f"{tag}moved", "2")
    begin_migration(cluster, slot, source, target)
    migrate(cluster, source, target, f"{tag}moved")

    async def scenario() -> tuple[list[Any], list[Any], int]:
        link = ClusterLink(cluster.url)
        try:
            await link.connect()
            fetches = shard_fetches(cluster)
            replies = await link.call(
                ("GET", f"{tag}here"), ("GET", f"{tag}moved"), ("SET", f"{tag}new", "3"),
                ("MULTI",), ("GET", f"{tag}moved"), ("EXEC",),
            )  # fmt: skip
            again = await link.call(("GET", f"{tag}here"), ("GET", f"{tag}new"))
            return replies, again, shard_fetches(cluster) - fetches
        finally:
            await link.close()

    try:
        replies, again, fetched = run(scenario())
    finally:
        end_migration(cluster, slot, source, target)
    assert replies == [b"1", b"2", b"OK", b"OK", b"QUEUED", [b"2"]]
    assert again == [b"1", b"3"]
    assert fetched == 0  # ASK is for one key: the slot stays where the map has it


def test_ask_keys_land_on_the_importing_node(cluster: ClusterSet) -> None:
    by_node = tags(cluster, "asked")
    source, target, _ = sorted(by_node)
    tag = by_node[source][0]
    slot = slot_of(tag)
    begin_migration(cluster, slot, source, target)

    async def scenario() -> list[Any]:
        link = ClusterLink(cluster.url)
        try:
            return await link.call(("SET", f"{tag}new", "v"))
        finally:
            await link.close()

    try:
        assert run(scenario()) == [b"OK"]
        # A key missing on the migrating node is written where the slot is going.
        assert cluster.command(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert asking_get(target, f"{tag}new") == b"v"
    finally:
        end_migration(cluster, slot, source, target)


def test_tryagain_is_retried_a_few_times_then_returned(cluster: ClusterSet) -> None:
    by_node = tags(cluster, "again")
    source, target, _ = sorted(by_node)
    tag = by_node[source][0]
    slot = slot_of(tag)
    cluster.command(source, "MSET", f"{tag}a", "1", f"{tag}b", "2")
    begin_migration(cluster, slot, source, target)
    migrate(cluster, source, target, f"{tag}b")
    before = mget_tries(cluster, source)

    async def scenario() -> list[Any]:
        link = ClusterLink(cluster.url)
        try:
            # Half the keys migrated: neither node can answer the MGET until the rest are.
            return await link.call(("MGET", f"{tag}a", f"{tag}b"), ("GET", f"{tag}a"))
        finally:
            await link.close()

    try:
        (mget, value) = run(scenario())
    finally:
        end_migration(cluster, slot, source, target)
    assert isinstance(mget, ResponseError) and str(mget).startswith("TRYAGAIN")
    assert value == b"1"
    assert mget_tries(cluster, source) - before == 1 + MAX_RETRIES


def mget_tries(cluster: ClusterSet, port: int) -> int:
    """MGETs the node on ``port`` received, run or refused."""
    stats = cluster.info(port, "commandstats").get("cmdstat_mget", {})
    return int(stats.get("calls", 0)) + int(stats.get("rejected_calls", 0))


def blocked_reads(cluster: ClusterSet, port: int) -> int:
    with cluster.client(port) as client:
        clients = client.client_list()
    return sum(1 for c in clients if c.get("cmd") == "xread" and "b" in c.get("flags", ""))


def test_blocking_reads_do_not_hold_up_calls_to_their_node(cluster: ClusterSet) -> None:
    by_node = tags(cluster, "block")
    port = sorted(by_node)[0]
    first, second = by_node[port][:2]

    async def scenario() -> tuple[list[Any], bool, list[Any], list[Any]]:
        link = ClusterLink(cluster.url)
        try:
            reads = [
                asyncio.ensure_future(
                    link.call(("XREAD", "BLOCK", 2000, "STREAMS", f"{tag}s", "$"), block_s=2.0)
                )
                for tag in (first, second)
            ]
            # Both reads wait on the node now.
            await asyncio.to_thread(
                cluster.wait, lambda: blocked_reads(cluster, port) == 2, 5, "two blocked reads"
            )
            answered = await link.call(("INCR", f"{first}n"), ("GET", f"{first}n"))
            still_blocked = not any(read.done() for read in reads)
            await link.call(
                ("XADD", f"{first}s", "*", "f", "1"), ("XADD", f"{second}s", "*", "f", "2")
            )
            first_read, second_read = await asyncio.gather(*reads)
            return answered, still_blocked, first_read, second_read
        finally:
            await link.close()

    answered, still_blocked, first_read, second_read = run(scenario())
    assert answered == [1, b"1"]
    assert still_blocked  # the call answered while both reads still waited
    assert first_read[0][0][0] == f"{first}s".encode() and first_read[0][0][1][0][1] == [b"f", b"1"]
    assert second_read[0][0][0] == f"{second}s".encode()


def test_calls_reach_the_promoted_replica_after_a_primary_is_killed() -> None:
    with ClusterSet() as cluster:
        a, b, _ = spread(cluster, "failover")
        victim = cluster.primary_of(a)

        async def scenario() -> tuple[list[Any], list[Any], list[Any]]:
            link = ClusterLink(cluster.url)
            try:
                # WAIT: the replica has the write before its primary dies.
                written = await link.call(("SET", f"{a}k", "kept"), ("WAIT", 1, 5000))
                victim.kill()
                with pytest.raises(RedisConnectionError):
                    await link.call(("GET", f"{a}k"))
                elsewhere = await link.call(("SET", f"{b}k", "up"))  # other primaries serve
                await asyncio.to_thread(cluster.wait_failover, victim.port, 20)
                return written, elsewhere, await link.call(("GET", f"{a}k"), ("GET", f"{b}k"))
            finally:
                await link.close()

        written, elsewhere, after = run(scenario())
        assert written == [b"OK", 1]
        assert elsewhere == [b"OK"]
        assert after == [b"kept", b"up"]
        assert cluster.primary_of(a).port != victim.port
