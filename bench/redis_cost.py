"""What Weir asks of Redis per request: commands, bytes and Redis's own time.

Every request crosses Redis several times, so one Redis core bounds a mesh on one Redis,
and the cost per request is what a Redis Cluster must spread. Before and after each
measured point the bench reads Redis's own counters (``INFO commandstats``, ``INFO stats``)
from the private Redis of ``weir up``; the differences, divided by the requests answered,
are the point's Redis cost. The bench's own ``INFO`` calls are left out of the command
counts (their few KiB of replies stay in the bytes, a rounding error over thousands of
requests).

From the Redis process's CPU per request (bench.cpu's ``redis`` role), the report projects
the ceiling of one Redis core: one second of CPU over the µs a request costs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from bench.analysis import WEIR, Point

OWN_COMMANDS = frozenset({"info"})
COMMANDS = "commands"
BYTES_IN = "bytes_in"
BYTES_OUT = "bytes_out"
USEC = "usec"  # Redis's time inside commands, µs per request
TOP_COMMANDS = 6


@dataclass(frozen=True)
class RedisMark:
    """Redis's counters at one moment: calls and µs per command, bytes in and out."""

    calls: dict[str, int]
    usec: dict[str, int]
    bytes_in: int
    bytes_out: int

    @classmethod
    def read(cls, client: redis.Redis) -> RedisMark:
        """Read the counters through ``client``: one connection for both marks of a point,
        so that no connection's handshake (``HELLO``) falls between them."""
        commands: dict[str, Any] = client.info("commandstats")
        stats: dict[str, Any] = client.info("stats")
        names = {key: key.removeprefix("cmdstat_") for key in commands}
        return cls(
            calls={names[k]: int(v["calls"]) for k, v in commands.items()},
            usec={names[k]: int(v["usec"]) for k, v in commands.items()},
            bytes_in=int(stats["total_net_input_bytes"]),
            bytes_out=int(stats["total_net_output_bytes"]),
        )

    def per_request(self, later: RedisMark, answered: int) -> dict[str, float]:
        """Commands, bytes and µs per answered request, and each command's calls (``cmd:``)."""
        n = max(answered, 1)
        calls = {
            name: count - self.calls.get(name, 0)
            for name, count in later.calls.items()
            if name not in OWN_COMMANDS and count > self.calls.get(name, 0)
        }
        usec = sum(
            later.usec[name] - self.usec.get(name, 0) for name in calls if name in later.usec
        )
        cost = {
            COMMANDS: sum(calls.values()) / n,
            BYTES_IN: (later.bytes_in - self.bytes_in) / n,
            BYTES_OUT: (later.bytes_out - self.bytes_out) / n,
            USEC: usec / n,
        }
        cost.update({f"cmd:{name}": count / n for name, count in sorted(calls.items())})
        return cost


def top_commands(cost: dict[str, float]) -> str:
    """``xadd 2.0, evalsha 1.0, ...``: the most called commands per request."""
    calls = [(k.removeprefix("cmd:"), v) for k, v in cost.items() if k.startswith("cmd:")]
    ranked = sorted(calls, key=lambda item: (-item[1], item[0]))[:TOP_COMMANDS]
    return ", ".join(f"{name} {count:.2f}" for name, count in ranked)


def ceiling_per_core(point: Point) -> float | None:
    """Requests per second one Redis core could serve at this point's cost, if measured."""
    redis_us = point.cpu_us_per_request.get("redis")
    return 1e6 / redis_us if redis_us else None


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def redis_table(points: list[Point]) -> list[str]:
    """Per Weir point: Redis commands, bytes and CPU per request, and one core's ceiling."""
    measured = [p for p in points if p.server == WEIR and p.redis_per_request]
    if not measured:
        return []
    header = [
        "model", "concurrency", "runtime", "commands/req", "bytes in/out per req",
        "Redis CPU µs/req", "in commands µs/req", "one Redis core, req/s", "most called",
    ]  # fmt: skip
    rows = []
    for p in measured:
        cost = p.redis_per_request
        ceiling = ceiling_per_core(p)
        rows.append([
            p.model, p.concurrency, p.runtime, f"{cost[COMMANDS]:.1f}",
            f"{cost[BYTES_IN]:.0f} / {cost[BYTES_OUT]:.0f}",
            f"{p.cpu_us_per_request.get('redis', 0.0):.0f}", f"{cost[USEC]:.1f}",
            f"{ceiling:.0f}" if ceiling else "-", top_commands(cost),
        ])  # fmt: skip
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]
