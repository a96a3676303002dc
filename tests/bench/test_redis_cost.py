"""The bench's Redis cost per request, read from a real redis-server's own counters."""

from __future__ import annotations

from pathlib import Path

import redis

from bench.analysis import BASELINE, WEIR, Point
from bench.redis_cost import BYTES_IN, BYTES_OUT, COMMANDS, USEC, RedisMark, redis_table
from bench.servers import weir_server
from weir.redis_server import RedisServer


def test_a_mark_counts_commands_and_bytes_per_request_without_its_own_info() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        client.ping()
        before = RedisMark.read(client)
        for _ in range(10):
            client.xadd("s", {"f": b"x" * 100})
        for _ in range(5):
            client.incr("n")
        after = RedisMark.read(client)
        client.close()
    cost = before.per_request(after, answered=5)
    assert (
        cost[COMMANDS] == 3.0
    )  # (10 XADD + 5 INCRBY, what redis-py sends for incr) / 5; the marks' INFO calls left out
    assert cost["cmd:xadd"] == 2.0 and cost["cmd:incrby"] == 1.0
    assert set(cost) == {COMMANDS, BYTES_IN, BYTES_OUT, USEC, "cmd:xadd", "cmd:incrby"}
    assert cost[BYTES_IN] > 2 * 100  # two 100-byte values per request, at least
    assert cost[BYTES_OUT] > 0 and cost[USEC] >= 0


def test_the_report_shows_weirs_redis_cost_and_one_cores_ceiling() -> None:
    cost = {COMMANDS: 7.5, BYTES_IN: 900.0, BYTES_OUT: 700.0, USEC: 12.0, "cmd:xadd": 3.0}
    weir = Point(WEIR, "tiny_mlp", 64, 4000.0, 1.0, 2.0, 3.0, 8.0, 40000, 0,
                 cpu_us_per_request={"gateway": 200.0, "redis": 40.0},
                 redis_per_request=cost)  # fmt: skip
    baseline = Point(BASELINE, "tiny_mlp", 64, 900.0, 1.0, 2.0, 3.0, 1.0, 9000, 0)
    header, _, row = redis_table([weir, baseline])
    assert "one Redis core, req/s" in header
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:8] == ["tiny_mlp", "64", "torch", "7.5", "900 / 700", "40", "12.0", "25000"]
    assert cells[8] == "xadd 3.00"
    assert redis_table([baseline]) == []


def test_the_bench_starts_weir_with_a_redis_it_can_read(tmp_path: Path) -> None:
    server = weir_server(tmp_path, 18000, tmp_path / "weir.log")
    port = server.command[server.command.index("--redis-port") + 1]
    assert server.redis_url == f"redis://127.0.0.1:{port}/0"
