"""How Weir's throughput grows with gateway processes: one prepared command for a big machine.

    python -m bench.scaling --out DIR                     # 1, 2, 4 and 8 gateway processes
    python -m bench.scaling --out DIR --gateways 1,2 --load python

For each gateway count G it starts the embedded mesh afresh (``weir up --gateway-processes G``,
with ``--batchers`` and ``--cpu-workers`` scaled with G unless fixed, see below), serving one
model (``tiny_mlp`` by default: its batch computes in microseconds, so the gateways set its
rate), and drives a closed loop of ``--concurrency-per-gateway`` times G keep-alive connections
posting the bench's request body (:mod:`bench.workload`): ``--warmup-s`` not counted, then
``--duration-s`` counted. Per point: req/s, its growth over one gateway, p50 and p99,
failures, the mean batch (the model's statistics), the CPU per request of each process role
(:mod:`bench.cpu`) and the cores the mesh kept busy. With ``--rounds`` N > 1 the points run N
times, in alternating order (1, 2, 4, 8, then 8, 4, 2, 1, ...), and each gateway count's best
round is reported, as the CPU bench takes the best of alternating rounds: a machine whose
speed drifts over minutes then favours no point.

A single Redis and, unless more are asked for, a single batcher serve every gateway; the
processes' CPU per request shows which of them a run ran into. "Enough workers": by default
one CPU worker per two gateways and one batcher per four (a tiny_mlp request costs a worker
about a third and a batcher about a seventh of what it costs a gateway).

The load is ``wrk`` when it is on ``PATH`` (``--load auto``, with ``--load-threads`` threads)
or :mod:`bench.http_load` (``--load python``, in ``--load-processes`` processes): a GPU
machine lent without a network has no wrk. Either shares the machine with the mesh.

It prints a markdown table and writes it to ``DIR/scaling.md``, every number to
``DIR/scaling.json`` and each mesh's log to ``DIR/scaling-logs/``. The run exits 1 when a
point failed to start or answered with errors; the growth goal (5 times the req/s from 1 to
8 gateways) is stated below the table, not enforced.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from bench import http_load
from bench.cpu import CpuMark
from bench.servers import ServerProcess, batch_counts, http_get
from bench.variants import Runtime, Variant
from bench.workload import bench_repository, write_body
from bench.wrk import run_wrk
from weir.redis_server import free_port

logger = logging.getLogger(__name__)
T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
GOAL_GROWTH = 5.0  # 1 -> 8 gateway processes
TIMES = "\N{MULTIPLICATION SIGN}"


@dataclass
class Point:
    """One gateway count's measurement."""

    gateways: int
    batchers: int
    workers: int
    connections: int
    requests_per_s: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    failures: int = 0
    mean_batch: float = 0.0
    cpu_us: dict[str, float] = field(default_factory=dict)  # per request, by process role
    cores_busy: float = 0.0
    error: str = ""
    round: int = 1


def scaled(fixed: int, gateways: int, per: int) -> int:
    """``fixed`` when set (> 0), else one per ``per`` gateways, at least one."""
    return fixed if fixed > 0 else max(1, math.ceil(gateways / per))


def prepare_repository(source: Path, model: str, target: Path) -> Path:
    """``target`` holding only ``model`` from ``source``, hard-linked, built there if missing.

    Weir loads every model of its repository; a repository of one keeps the others' start-up
    and memory out of the measurement.
    """
    if not (source / model / "1").is_dir():
        builder = ROOT / "examples" / "build_models.py"
        command = [sys.executable, str(builder), "--repository", str(source), "--models", model]
        subprocess.run(command, check=True)
    return bench_repository(source, [Variant(model, Runtime.TORCH)], target, target)


def mesh(repository: Path, point: Point, log_path: Path) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "weir.cli", "up", "--http-port", str(port)]
    command += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]
    command += ["--repository", str(repository), "--gateway-processes", str(point.gateways)]
    command += ["--batchers", str(point.batchers), "--cpu-workers", str(point.workers)]
    return ServerProcess("weir", command, port, log_path)


class Load(NamedTuple):
    """One closed-loop run's outcome."""

    requests_per_s: float  # answered ones
    p50_ms: float
    p99_ms: float
    failures: int
    answered: int


def load(url: str, body: Path, connections: int, seconds: float, args: argparse.Namespace) -> Load:
    """One closed-loop run through wrk or bench.http_load, as ``args.load_tool`` says."""
    if args.load_tool == "wrk":
        got = run_wrk(url, body, connections, seconds, threads=args.load_threads)
        answered = got.requests - got.errors
        return Load(got.ok_per_s, got.p50_us / 1e3, got.p99_us / 1e3, got.errors, answered)
    target = http_load.Target.of(url, body.read_bytes())
    result = http_load.run(args.pool, target, connections, seconds, 0.0, args.load_processes)
    return Load(result.requests_per_s, result.p50_ms, result.p99_ms, result.failures,
                result.requests)  # fmt: skip


def measure(repository: Path, body: Path, point: Point, args: argparse.Namespace) -> Point:
    """Start a mesh of ``point``'s size, load it, stop it; the point filled in."""
    suffix = "" if point.round == 1 else f"-round-{point.round}"
    log_path = args.out / "scaling-logs" / f"gateways-{point.gateways}{suffix}.log"
    server = mesh(repository, point, log_path).start()
    try:
        server.wait_ready()
        url = server.infer_url(args.model)
        if http_get(f"{server.url}/v2/models/{args.model}/ready")[0] != 200:
            raise RuntimeError(f"{args.model} is not ready:\n{server.log_tail()}")
        if args.warmup_s > 0:
            load(url, body, point.connections, args.warmup_s, args)
        counts = batch_counts(server, args.model)
        before = CpuMark.now([server.pid])
        run = load(url, body, point.connections, args.duration_s, args)
        after = CpuMark.now([server.pid])
        inferences, executions = batch_counts(server, args.model)
        inferences, executions = inferences - counts[0], executions - counts[1]
        point.requests_per_s, point.failures = run.requests_per_s, run.failures
        point.p50_ms, point.p99_ms = run.p50_ms, run.p99_ms
        point.mean_batch = inferences / executions if executions else 0.0
        point.cpu_us = before.server_us(after, server.pid, run.answered)
        wall = after.wall_s - before.wall_s
        point.cores_busy = sum(point.cpu_us.values()) * run.answered / 1e6 / wall if wall else 0.0
    finally:
        server.stop()
    return point


def run(args: argparse.Namespace) -> list[Point]:
    """Every point of every round, in the order run."""
    points = []
    (args.out / "scaling-logs").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="weir-scaling-") as tmp:
        repository = prepare_repository(args.repository, args.model, Path(tmp) / "repository")
        body = write_body(repository, args.model, Path(tmp) / "body.json")
        for index in range(args.rounds):
            order = args.gateways if index % 2 == 0 else args.gateways[::-1]
            for gateways in order:
                point = Point(
                    gateways=gateways,
                    batchers=scaled(args.batchers, gateways, 4),
                    workers=scaled(args.cpu_workers, gateways, 2),
                    connections=args.concurrency_per_gateway * gateways,
                    round=index + 1,
                )
                try:
                    measure(repository, body, point, args)
                    logger.info(
                        "round %d, %d gateways: %.0f req/s", point.round, gateways,
                        point.requests_per_s,
                    )  # fmt: skip
                except Exception as exc:  # the other points still run; the report names it
                    logger.exception("%d gateways failed", gateways)
                    point.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                points.append(point)
    return points


def best_points(points: list[Point], gateways: list[int]) -> list[Point]:
    """Each gateway count's best round (most req/s; a failed round only where all failed)."""
    best = []
    for count in gateways:
        rounds = [p for p in points if p.gateways == count]
        answered = [p for p in rounds if not p.error]
        best.append(max(answered or rounds, key=lambda p: p.requests_per_s))
    return best


# --- the report -----------------------------------------------------------------------------


def growth(points: list[Point], point: Point) -> float:
    first = next((p for p in points if p.gateways == 1 and p.requests_per_s > 0), None)
    return point.requests_per_s / first.requests_per_s if first else 0.0


def table(points: list[Point]) -> str:
    lines = [
        "| gateways | batchers | workers | connections | req/s | over 1 gateway | p50 ms | p99 ms "
        "| failed | mean batch | CPU µs/req, by process | cores busy |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for p in points:
        if p.error:
            lines.append(f"| {p.gateways} | {p.batchers} | {p.workers} | {p.connections} "
                         f"| failed: {p.error} | | | | | | | |")  # fmt: skip
            continue
        roles = sorted(p.cpu_us.items(), key=lambda item: -item[1])
        cpu = f"{sum(p.cpu_us.values()):.0f}: " + ", ".join(f"{k} {v:.0f}" for k, v in roles)
        lines.append(
            f"| {p.gateways} | {p.batchers} | {p.workers} | {p.connections} "
            f"| {p.requests_per_s:.0f} | {growth(points, p):.2f}{TIMES} | {p.p50_ms:.2f} "
            f"| {p.p99_ms:.2f} | {p.failures} | {p.mean_batch:.1f} | {cpu} | {p.cores_busy:.1f} |"
        )
    return "\n".join(lines)


def goal_line(points: list[Point]) -> str:
    eight = next((p for p in points if p.gateways == 8 and p.requests_per_s > 0), None)
    if eight is None or growth(points, eight) == 0:
        return f"Goal, 1 → 8 gateway processes ≥ {GOAL_GROWTH:g}{TIMES}: not measured in this run."
    reached = growth(points, eight)
    verdict = "met" if reached >= GOAL_GROWTH else "not met"
    goal = f"Goal, 1 → 8 gateway processes ≥ {GOAL_GROWTH:g}{TIMES}"
    return f"{goal}: {reached:.2f}{TIMES}, {verdict}."


def machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine()}  # fmt: skip


def report(every: list[Point], args: argparse.Namespace) -> str:
    points = best_points(every, args.gateways)
    about = machine()
    shown = ", ".join(f"{key} {value}" for key, value in about.items())
    load_tool = (f"wrk, {args.load_threads} threads" if args.load_tool == "wrk"
                 else f"bench.http_load, {args.load_processes} processes")  # fmt: skip
    rounds = f"; each point the best of {args.rounds} alternating rounds" if args.rounds > 1 else ""
    text = (
        f"{args.model}, {args.duration_s:g} s per point after {args.warmup_s:g} s of warm-up"
        f"{rounds}; load: {load_tool}.\n\n{table(points)}\n\n{goal_line(points)}\n"
        f"Machine: {shown}.\n"
    )
    if args.rounds > 1:
        text += (
            "\nEvery round, req/s: "
            + "; ".join(
                f"{p.gateways} gateways, round {p.round}: "
                + (f"{p.requests_per_s:.0f}" if not p.error else "failed")
                for p in every
            )
            + ".\n"
        )
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings.pop("pool", None)
    document = {
        "machine": about,
        "settings": settings,
        "points": [asdict(p) for p in points],
        "rounds": [asdict(p) for p in every],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.md").write_text(text)
    (args.out / "scaling.json").write_text(json.dumps(document, indent=2) + "\n")
    return text


# --- the command ----------------------------------------------------------------------------


def _numbers(text: str) -> list[int]:
    numbers = [int(part) for part in text.split(",") if part.strip()]
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected counts of 1 or more, got {text!r}")
    return numbers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Weir's req/s against its gateway processes")
    parser.add_argument("--out", type=Path, required=True, help="where the table and JSON go")
    parser.add_argument("--gateways", type=_numbers, default=[1, 2, 4, 8])
    parser.add_argument("--model", default="tiny_mlp")
    parser.add_argument("--repository", type=Path, default=ROOT / "examples" / "models",
                        help="where the model is (built there when missing)")  # fmt: skip
    parser.add_argument("--concurrency-per-gateway", type=int, default=64)
    parser.add_argument("--batchers", type=int, default=0, help="0: one per 4 gateways")
    parser.add_argument("--cpu-workers", type=int, default=0, help="0: one per 2 gateways")
    parser.add_argument("--duration-s", type=float, default=8.0, help="measured, per point")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="not counted, per point")
    parser.add_argument("--rounds", type=int, default=1, help="alternating; each point's best")
    cores = os.cpu_count() or 2
    add_load_arguments(parser, threads=max(1, cores // 8), processes=max(1, cores // 4))
    args = parse_with_load(parser, argv)
    if args.rounds < 1:
        parser.error("--rounds: expected 1 or more")
    return args


def add_load_arguments(parser: argparse.ArgumentParser, threads: int, processes: int) -> None:
    """The load generator's options: wrk (``--load-threads``) or bench.http_load."""
    parser.add_argument("--load", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--load-threads", type=int, default=threads)
    parser.add_argument("--load-processes", type=int, default=processes)


def parse_with_load(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The arguments, with ``load_tool`` (``wrk`` or ``python``) settled from ``--load``."""
    args = parser.parse_args(argv)
    wrk = shutil.which("wrk")
    if args.load == "wrk" and wrk is None:
        parser.error("--load wrk: wrk is not on PATH")
    args.load_tool = "wrk" if args.load == "wrk" or (args.load == "auto" and wrk) else "python"
    return args


def with_load(args: argparse.Namespace, run: Callable[[argparse.Namespace], T]) -> T:
    """``run(args)``, with ``args.pool`` the load processes' pool when the load is Python's."""
    args.pool = None
    if args.load_tool != "python":
        return run(args)
    with http_load.load_pool(args.load_processes) as pool:
        args.pool = pool
        return run(args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    started = time.monotonic()
    points = with_load(args, run)
    print(report(points, args))
    logger.info("scaling run took %.0f s", time.monotonic() - started)
    return 1 if any(p.error or p.failures for p in points) else 0


if __name__ == "__main__":
    raise SystemExit(main())
