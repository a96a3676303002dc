"""A closed-loop HTTP/1.1 load generator: asyncio connections in several processes.

Each of ``processes`` processes runs one asyncio loop (uvloop when installed) holding its share
of ``concurrency`` keep-alive connections, opened with ``asyncio.open_connection``. A
connection writes one pre-built request (the same bytes every time), reads the status line
and headers, then ``Content-Length`` bytes of body, and sends its next request as soon as the
answer is in: a closed loop, so the offered load is ``concurrency`` requests in flight.

Timing: every process starts on the same ``time.monotonic()`` instant (CLOCK_MONOTONIC, one
clock for every process of a Linux machine), sends for ``warmup_s + duration_s`` and counts
only the answers that arrive in the last ``duration_s``: requests/s is those answers over
``duration_s``. A latency is from writing a request to reading its body's last byte. An
answer other than 200, a timeout, a broken connection or a response this reader does not
understand (no ``Content-Length``: a chunked body) is a failure; the connection is then
opened again. Each process hands its latencies and counts back through a
``multiprocessing`` pool, whose processes are spawned (never forked from a parent that may
hold a CUDA context) and reused from point to point.

Only the standard library (and uvloop, when there) so that thousands of requests per second
cost the load little CPU, and nothing needs installing on a machine without a network.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

REQUEST_TIMEOUT_S = 30.0
# How long after the window the last answers may take before their connections are cancelled.
GRACE_S = 5.0
# Between handing out the shares and the start: time for every process to be ready.
START_DELAY_S = 0.3
# After a failed connection, before the next: a refused port is not hammered in a busy loop.
RETRY_PAUSE_S = 0.01


class ProtocolError(Exception):
    """A response this reader cannot frame (it reads Content-Length bodies only)."""


@dataclass(frozen=True)
class Target:
    """Where the load goes: one URL and the body POSTed to it every time."""

    host: str
    port: int
    path: str
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def of(cls, url: str, body: bytes) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url}: the load generator speaks plain http:// only")
        return cls(parts.hostname, parts.port or 80, parts.path or "/", body)

    def request(self) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: {self.content_type}\r\nContent-Length: {len(self.body)}\r\n\r\n"
        )
        return head.encode() + self.body


@dataclass(frozen=True)
class Window:
    """When the load runs, on ``time.monotonic()``: answers count from ``measure_from``."""

    start: float
    measure_from: float
    end: float


@dataclass
class Tally:
    """What one process measured: latencies of the answers counted, and the failures."""

    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def record(self, window: Window, sent: float, status: int) -> None:
        done = time.monotonic()
        if not window.measure_from <= done <= window.end:
            return
        if status == 200:
            self.latencies_s.append(done - sent)
        else:
            self.fail(window, f"status {status}")

    def fail(self, window: Window, reason: str) -> None:
        if window.measure_from <= time.monotonic() <= window.end:
            self.failures += 1
            self.errors[reason] += 1


@dataclass(frozen=True)
class LoadResult:
    """One load point: answers counted, failures, and the latency percentiles, in ms."""

    concurrency: int
    requests: int
    failures: int
    duration_s: float
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.duration_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "failures": self.failures,
            "duration_s": self.duration_s,
            "requests_per_s": self.requests_per_s,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "errors": self.errors,
        }


def percentile_ms(sorted_s: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted seconds, in ms; NaN when there are none."""
    if not sorted_s:
        return float("nan")
    return sorted_s[min(len(sorted_s) - 1, int(fraction * len(sorted_s)))] * 1e3


def shares(concurrency: int, processes: int) -> list[int]:
    """``concurrency`` connections split over at most ``processes``, none empty."""
    count = max(1, min(processes, concurrency))
    return [concurrency // count + (1 if i < concurrency % count else 0) for i in range(count)]


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The status of one response, its body read; and whether the connection stays open."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, _, headers = head.partition(b"\r\n")
    try:
        status = int(status_line.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise ProtocolError(f"bad status line {status_line[:80]!r}") from None
    length, close = _framing(headers)
    await reader.readexactly(length)
    return status, not close


def _framing(headers: bytes) -> tuple[int, bool]:
    length, close = -1, False
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value) if value.strip().isdigit() else -1
        elif name == b"connection":
            close = value.strip().lower() == b"close"
    if length < 0:
        raise ProtocolError("a response without Content-Length")
    return length, close


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
    window: Window,
    tally: Tally,
) -> None:
    """Requests one after another on one connection until the window ends or it closes."""
    while time.monotonic() < window.end:
        sent = time.monotonic()
        writer.write(request)
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            status, keep_alive = await read_response(reader)
        tally.record(window, sent, status)
        if not keep_alive:
            return


CONNECTION_ERRORS = (
    OSError,
    TimeoutError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ProtocolError,
)


async def connection(target: Target, request: bytes, window: Window, tally: Tally) -> None:
    """One closed-loop client: (re)connects, then exchanges requests until the window ends."""
    while time.monotonic() < window.end:
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(target.host, target.port)
            await _exchange(reader, writer, request, window, tally)
        except CONNECTION_ERRORS as exc:
            tally.fail(window, type(exc).__name__)
            await asyncio.sleep(RETRY_PAUSE_S)
        finally:
            if writer is not None:
                writer.close()


async def _load(target: Target, connections: int, window: Window) -> Tally:
    tally = Tally()
    request = target.request()
    await asyncio.sleep(max(0.0, window.start - time.monotonic()))
    clients = [
        asyncio.ensure_future(connection(target, request, window, tally))
        for _ in range(connections)
    ]
    _, late = await asyncio.wait(clients, timeout=window.end - time.monotonic() + GRACE_S)
    for client in late:  # answers past the window no longer count
        client.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    return tally


def _run(coroutine: Coroutine[Any, Any, Tally]) -> Tally:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coroutine)


def run_share(target: Target, connections: int, window: Window) -> Tally:
    """One process's share: ``connections`` clients on one event loop (a pool's task)."""
    return _run(_load(target, connections, window))


@contextmanager
def load_pool(processes: int) -> Iterator[Pool]:
    """Spawned load processes, reused by every :func:`run` given the pool."""
    pool = multiprocessing.get_context("spawn").Pool(processes)
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


def run(
    pool: Pool,
    target: Target,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    processes: int,
) -> LoadResult:
    """One closed-loop point of ``concurrency`` connections over ``processes`` processes."""
    start = time.monotonic() + START_DELAY_S
    window = Window(start, start + warmup_s, start + warmup_s + duration_s)
    jobs = [(target, share, window) for share in shares(concurrency, processes)]
    tallies: list[Tally] = pool.starmap(run_share, jobs)
    latencies = sorted(value for tally in tallies for value in tally.latencies_s)
    errors: Counter[str] = sum((tally.errors for tally in tallies), Counter())
    return LoadResult(
        concurrency=concurrency,
        requests=len(latencies),
        failures=sum(tally.failures for tally in tallies),
        duration_s=duration_s,
        p50_ms=percentile_ms(latencies, 0.50),
        p99_ms=percentile_ms(latencies, 0.99),
        errors=dict(errors),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="closed-loop HTTP/1.1 POST load, JSON out")
    parser.add_argument("url", help="http://HOST:PORT/PATH")
    parser.add_argument("--body", type=Path, required=True, help="the file POSTed every time")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args(argv)
    target = Target.of(args.url, args.body.read_bytes())
    with load_pool(args.processes) as pool:
        result = run(pool, target, args.concurrency, args.duration_s, args.warmup_s, args.processes)
    print(json.dumps(result.as_dict()))


if __name__ == "__main__":
    main()
