"""The measured points: each model at each concurrency, against each server and runtime in turn."""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.analysis import BASELINE, TORCH, WEIR, WEIR_ARCHIVES, Point
from bench.cpu import CpuMark
from bench.redis_cost import RedisMark
from bench.servers import ServerProcess, batch_counts, http_post
from bench.variants import served_name
from bench.wrk import WrkResult, run_wrk

logger = logging.getLogger(__name__)

# TorchScript's profiling executor runs the first ~20 calls at a new model's shape slowly.
PRIME_REQUESTS = 30


@dataclass(frozen=True)
class Schedule:
    """What to run: concurrencies; per point, seconds of warm-up and of measurement, and rounds.

    Each point is measured ``rounds`` times, the servers alternating and the order reversed
    each round, and the round with the most requests per second is kept: the shared machine's
    speed drifts over seconds (a compute-bound point can run at half speed for ten seconds
    with no other process busy), and the raw limit too keeps the faster of its two runs.
    """

    concurrency: list[int]
    warmup_s: int
    duration_s: int
    rounds: int = 2


@dataclass(frozen=True)
class Contender:
    """One server serving a model through one runtime: what a point measures."""

    server: ServerProcess
    runtime: str = TORCH

    def url(self, model: str) -> str:
        return self.server.infer_url(served_name(model, self.runtime))

    def label(self, model: str) -> str:
        return f"{self.server.name} {served_name(model, self.runtime)}"


@dataclass(frozen=True)
class Workload:
    """One model, its request body, and who serves it."""

    model: str
    body: Path
    contenders: list[Contender]


class PointRunner:
    """Runs every point against the contenders, alternating them so noise hurts all alike."""

    def __init__(self, servers: list[ServerProcess], schedule: Schedule) -> None:
        self.servers = servers
        self.schedule = schedule
        # Weir's Redis, read before and after each point through one connection per server.
        urls = [server.redis_url for server in servers if server.redis_url]
        self.redis = {url: redis.Redis.from_url(url) for url in urls}

    def run(self, workloads: list[Workload]) -> list[Point]:
        points = []
        for work in workloads:
            for contender in work.contenders:
                prime(contender, work.model, work.body)
            for concurrency in self.schedule.concurrency:
                points.extend(self._rounds(work, concurrency))
        return points

    def _rounds(self, work: Workload, concurrency: int) -> list[Point]:
        """Per contender, the best of the schedule's rounds at one point (none if all failed)."""
        best: dict[Contender, Point] = {}
        for round_ in range(max(self.schedule.rounds, 1)):
            order = work.contenders if round_ % 2 == 0 else work.contenders[::-1]
            for contender in order:
                try:
                    point = self.measure(contender, work.model, concurrency, work.body)
                except (subprocess.SubprocessError, ValueError, RuntimeError):
                    label = f"{contender.label(work.model)} c{concurrency}"
                    logger.exception("%s failed; skipped", label)
                    continue
                kept = best.get(contender)
                if kept is None or point.req_per_s > kept.req_per_s:
                    best[contender] = point
        return [best[c] for c in work.contenders if c in best]

    def measure(self, contender: Contender, model: str, concurrency: int, body: Path) -> Point:
        """Warm up, then one measured run, with Weir's batch counters and the CPU spent."""
        url = contender.url(model)
        run_wrk(url, body, concurrency, self.schedule.warmup_s)
        before = self._batch_counts(contender, model)
        client = self.redis.get(contender.server.redis_url or "")
        redis_before = RedisMark.read(client) if client else None
        mark = self._cpu_mark()
        result = run_wrk(url, body, concurrency, self.schedule.duration_s)
        later = self._cpu_mark()
        redis_after = RedisMark.read(client) if client else None
        after = self._batch_counts(contender, model)
        answered = result.requests - result.errors
        cpu = mark.server_us(later, contender.server.pid, answered)
        redis_cost = (
            redis_before.per_request(redis_after, answered)
            if redis_before is not None and redis_after is not None
            else {}
        )
        measured = Measured(
            result, mean_batch(before, after), mark.others_cores(later), cpu, redis_cost
        )
        point = to_point(contender, model, concurrency, measured)
        logger.info("%s", point)
        return point

    def _batch_counts(self, contender: Contender, model: str) -> tuple[int, int] | None:
        """Weir's counters; the baseline runs every request alone; None: not known."""
        if contender.server.name == BASELINE:
            return (0, 0)
        if contender.server.name not in (WEIR, WEIR_ARCHIVES):
            return None  # TorchServe reports no batch sizes
        return batch_counts(contender.server, served_name(model, contender.runtime))

    def _cpu_mark(self) -> CpuMark:
        return CpuMark.now([server.pid for server in self.servers])


def mean_batch(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """Rows per batch between two (inference, execution) counts; 1 if none ran, 0 if unknown."""
    if before is None or after is None:
        return 0.0
    batches = after[1] - before[1]
    return (after[0] - before[0]) / batches if batches else 1.0


@dataclass(frozen=True)
class Measured:
    """What one measured run gave, beside wrk's result.

    The mean batch (0: not known), others' CPU in cores, the server's CPU µs per
    answered request by process role, and (Weir) its Redis cost per request.
    """

    result: WrkResult
    mean_batch: float
    other_cpu: float
    cpu_us_per_request: dict[str, float]
    redis_per_request: dict[str, float]


def to_point(contender: Contender, model: str, concurrency: int, measured: Measured) -> Point:
    label = f"{contender.label(model)} c{concurrency}"
    result = measured.result
    if result.requests <= result.errors:
        raise ValueError(f"{label}: no request was answered in {result.duration_s:.1f} s")
    if result.errors:
        logger.warning("%s: %d requests failed", label, result.errors)
    return Point(
        server=contender.server.name,
        model=model,
        concurrency=concurrency,
        req_per_s=result.ok_per_s,
        p50_ms=result.p50_us / 1e3,
        p90_ms=result.p90_us / 1e3,
        p99_ms=result.p99_us / 1e3,
        mean_batch=measured.mean_batch,
        requests=result.requests,
        errors=result.errors,
        other_cpu=measured.other_cpu,
        runtime=str(contender.runtime),  # a plain string in the record, not the enum
        cpu_us_per_request=measured.cpu_us_per_request,
        redis_per_request=measured.redis_per_request,
    )


def prime(contender: Contender, model: str, body: Path, requests: int = PRIME_REQUESTS) -> None:
    """Send requests one by one until the runtime has settled on the model's first shape."""
    for _ in range(requests):
        status, answer = http_post(contender.url(model), body.read_bytes())
        if status != 200:
            label = contender.label(model)
            raise RuntimeError(f"{label} answered {status}: {answer[:300]!r}")
