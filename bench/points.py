"""The measured points: each model at each concurrency, against each server in turn."""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.analysis import WEIR, Point
from bench.cpu import CpuMark
from bench.servers import ServerProcess, batch_counts, http_post
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


class PointRunner:
    """Runs every point against the servers, alternating them so noise hurts both alike."""

    def __init__(self, servers: list[ServerProcess], schedule: Schedule) -> None:
        self.servers = servers
        self.schedule = schedule

    def run(self, bodies: dict[str, Path]) -> list[Point]:
        points = []
        for model, body in bodies.items():
            for server in self.servers:
                prime(server, model, body)
            for concurrency in self.schedule.concurrency:
                points.extend(self._rounds(model, concurrency, body))
        return points

    def _rounds(self, model: str, concurrency: int, body: Path) -> list[Point]:
        """Per server, the best of the schedule's rounds at one point (none if all failed)."""
        best: dict[str, Point] = {}
        for round_ in range(max(self.schedule.rounds, 1)):
            order = self.servers if round_ % 2 == 0 else self.servers[::-1]
            for server in order:
                try:
                    point = self.measure(server, model, concurrency, body)
                except (subprocess.SubprocessError, ValueError, RuntimeError):
                    label = f"{server.name} {model} c{concurrency}"
                    logger.exception("%s failed; skipped", label)
                    continue
                kept = best.get(server.name)
                if kept is None or point.req_per_s > kept.req_per_s:
                    best[server.name] = point
        return [best[s.name] for s in self.servers if s.name in best]

    def measure(self, server: ServerProcess, model: str, concurrency: int, body: Path) -> Point:
        """Warm up, then one measured run, with Weir's batch counters and others' CPU."""
        url = f"{server.url}/v2/models/{model}/infer"
        run_wrk(url, body, concurrency, self.schedule.warmup_s)
        before = self._batch_counts(server, model)
        mark = self._cpu_mark()
        result = run_wrk(url, body, concurrency, self.schedule.duration_s)
        other_cpu = mark.others_cores(self._cpu_mark())
        after = self._batch_counts(server, model)
        batches = after[1] - before[1]
        mean_batch = (after[0] - before[0]) / batches if batches else 1.0
        point = to_point(server.name, model, concurrency, result, mean_batch, other_cpu)
        logger.info("%s", point)
        return point

    def _batch_counts(self, server: ServerProcess, model: str) -> tuple[int, int]:
        # The baseline runs every request alone: (0, 0) reads as a mean batch of 1.
        return batch_counts(server, model) if server.name == WEIR else (0, 0)

    def _cpu_mark(self) -> CpuMark:
        return CpuMark.now([server.pid for server in self.servers])


def to_point(
    server: str, model: str, concurrency: int, result: WrkResult, batch: float, other_cpu: float
) -> Point:
    label = f"{server} {model} c{concurrency}"
    if result.requests <= result.errors:
        raise ValueError(f"{label}: no request was answered in {result.duration_s:.1f} s")
    if result.errors:
        logger.warning("%s: %d requests failed", label, result.errors)
    return Point(
        server=server,
        model=model,
        concurrency=concurrency,
        req_per_s=result.ok_per_s,
        p50_ms=result.p50_us / 1e3,
        p90_ms=result.p90_us / 1e3,
        p99_ms=result.p99_us / 1e3,
        mean_batch=batch,
        requests=result.requests,
        errors=result.errors,
        other_cpu=other_cpu,
    )


def prime(server: ServerProcess, model: str, body: Path, requests: int = PRIME_REQUESTS) -> None:
    """Send requests one by one until TorchScript has settled on the model's first shape."""
    url = f"{server.url}/v2/models/{model}/infer"
    for _ in range(requests):
        status, answer = http_post(url, body.read_bytes())
        if status != 200:
            raise RuntimeError(f"{server.name} answered {status} for {model}: {answer[:300]!r}")
