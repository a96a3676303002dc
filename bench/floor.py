"""Weir's gateway against the floor of a Python gateway, on one mesh, as CPU per request.

    python -m bench.floor --out DIR                   # tiny_mlp, concurrency 64, 2 rounds
    python -m bench.floor --out DIR --load python --concurrency 8 --duration-s 2

It starts the embedded mesh (``weir up``: Redis, gateway, batcher, one CPU worker) serving one
model, and beside it :mod:`bench.floor_gateway` on the same Redis: the mesh's protocol in
Python with nothing else. Each round loads one gateway, then the other, closed loop (wrk
when on ``PATH``, else :mod:`bench.http_load`), and reads every process's CPU from
``/proc``. Per gateway the report gives req/s and its own CPU per request, the lowest of the
rounds (other programs only ever add to it), and the mesh's other processes beside it. The
floor is what any gateway written in Python costs per request on the machine with this
design; what the real gateway costs past it pays for validation, errors, metrics,
deadlines, cancellation, failover and limits. It writes ``DIR/floor.md`` and
``DIR/floor.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import scaling
from bench.cpu import CpuMark, per_request_us, tree_cpu
from bench.servers import ServerProcess, http_get
from bench.workload import write_body
from weir.redis_server import free_port

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
READY_S = 60.0


@dataclass
class Run:
    """One gateway's load in one round."""

    gateway: str  # "weir" or "floor"
    round: int
    requests_per_s: float
    failures: int
    gateway_us: float  # the gateway process's CPU per answered request
    mesh_us: dict[str, float] = field(default_factory=dict)  # the mesh's other processes


def start_floor(redis_url: str, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The floor gateway on a free port, once its reply stream is there; and its URL."""
    port = free_port()
    command = [sys.executable, "-m", "bench.floor_gateway", "--redis-url", redis_url]
    log = log_path.open("wb")
    process = subprocess.Popen(
        [*command, "--port", str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the floor gateway exited:\n{log_path.read_text()[-2000:]}")
        if http_get(f"{url}/v2/health/ready", timeout_s=1.0)[0] == 200:
            return process, url
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the floor gateway did not get ready")


def gateway_pid(server: ServerProcess) -> int:
    """The embedded mesh's gateway process."""
    for pid, sample in tree_cpu(server.pid).items():
        if sample.role == "gateway":
            return pid
    raise RuntimeError("the mesh has no gateway process")


def measure(
    url: str, pid: int, server: ServerProcess, body: Path, args: argparse.Namespace
) -> tuple[float, int, float, dict[str, float]]:
    """Load ``url``: req/s, failures, the CPU per request of ``pid`` and of the mesh's
    other processes (the batcher, the worker, Redis)."""
    if args.warmup_s > 0:
        scaling.load(url, body, args.concurrency, args.warmup_s, args)
    before = CpuMark.now([server.pid])
    own_before = tree_cpu(pid)
    run = scaling.load(url, body, args.concurrency, args.duration_s, args)
    own_after = tree_cpu(pid)
    after = CpuMark.now([server.pid])
    own = per_request_us(own_before, own_after, run.answered)
    mesh = {k: v for k, v in before.server_us(after, server.pid, run.answered).items()
            if k not in ("gateway", "weir up") and v > 0}  # fmt: skip
    return run.requests_per_s, run.failures, sum(own.values()), mesh


def run(args: argparse.Namespace) -> list[Run]:
    runs: list[Run] = []
    logs = args.out / "floor-logs"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="weir-floor-") as tmp:
        repository = scaling.prepare_repository(args.repository, args.model, Path(tmp) / "repo")
        body = write_body(repository, args.model, Path(tmp) / "body.json")
        redis_port = free_port()
        port = free_port()
        command = [sys.executable, "-m", "weir.cli", "up", "--http-port", str(port),
                   "--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(redis_port),
                   "--repository", str(repository)]  # fmt: skip
        server = ServerProcess("weir", command, port, logs / "weir.log").start()
        floor = None
        try:
            server.wait_ready()
            floor, floor_url = start_floor(f"redis://127.0.0.1:{redis_port}/0", logs / "floor.log")
            targets = [
                ("weir", server.infer_url(args.model), gateway_pid(server)),
                ("floor", f"{floor_url}/v2/models/{args.model}/infer", floor.pid),
            ]
            for number in range(1, args.rounds + 1):
                for name, url, pid in targets if number % 2 else targets[::-1]:
                    rate, failures, own_us, mesh = measure(url, pid, server, body, args)
                    runs.append(Run(name, number, rate, failures, own_us, mesh))
                    logger.info("round %d, %s: %.0f req/s, %.0f µs", number, name, rate, own_us)
        finally:
            if floor is not None:
                floor.kill()
                floor.wait()
            server.stop()
    return runs


def best(runs: list[Run], gateway: str) -> Run | None:
    """The round in which ``gateway`` spent the least CPU per request."""
    mine = [r for r in runs if r.gateway == gateway and r.requests_per_s > 0]
    return min(mine, key=lambda r: r.gateway_us) if mine else None


def report(runs: list[Run], args: argparse.Namespace) -> str:
    lines = [
        "| gateway | round | req/s | failed | gateway CPU µs/req | the mesh's other processes |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in runs:
        mesh = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.mesh_us.items(), key=lambda i: -i[1]))
        lines.append(f"| {r.gateway} | {r.round} | {r.requests_per_s:.0f} | {r.failures} "
                     f"| {r.gateway_us:.0f} | {mesh} |")  # fmt: skip
    weir, floor = best(runs, "weir"), best(runs, "floor")
    summary = "Not both gateways answered: no comparison."
    if weir is not None and floor is not None:
        summary = (
            f"Lowest CPU per request: Weir's gateway {weir.gateway_us:.0f} µs, the floor "
            f"{floor.gateway_us:.0f} µs ({weir.gateway_us / floor.gateway_us:.2f} times)."
        )
    text = (
        f"{args.model}, concurrency {args.concurrency}, {args.duration_s:g} s per run after "
        f"{args.warmup_s:g} s of warm-up, {os.cpu_count()} cores.\n\n"
        + "\n".join(lines) + f"\n\n{summary}\n"
    )  # fmt: skip
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    settings.pop("pool", None)
    document = {"settings": settings, "runs": [asdict(r) for r in runs]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "floor.md").write_text(text)
    (args.out / "floor.json").write_text(json.dumps(document, indent=2) + "\n")
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Weir's gateway against a Python floor")
    parser.add_argument("--out", type=Path, required=True, help="where the table and JSON go")
    parser.add_argument("--model", default="tiny_mlp")
    parser.add_argument("--repository", type=Path, default=ROOT / "examples" / "models",
                        help="where the model is (built there when missing)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=8.0, help="measured, per run")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="not counted, per run")
    parser.add_argument("--rounds", type=int, default=2)
    scaling.add_load_arguments(parser, threads=1, processes=1)
    return scaling.parse_with_load(parser, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    runs = scaling.with_load(args, run)
    print(report(runs, args))
    return 1 if any(r.failures or not r.requests_per_s for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
