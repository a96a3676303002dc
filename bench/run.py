"""``make bench``: the raw limit, Weir and its peers (a naive baseline, TorchServe), one run.

For each model and runtime (torch, and ONNX Runtime and OpenVINO for the models that have
them): the raw limit (the runtime alone, in a subprocess) at batch sizes 1 to 64; then, at
each concurrency, a closed-loop wrk run against each peer (``--peers``: the naive FastAPI
baseline and TorchServe, torch only) and against Weir (``weir up``) through each runtime,
with the same body, each after a warm-up run. Weir's mean batch size per point comes from
its statistics endpoint; every server's CPU per request, by process, from ``/proc``; every
server's peak memory from its process tree (``weir up``'s for Weir). Writes
``<out>/<timestamp>.json``, ``<out>/latest.md`` and ``<out>/latest.png`` and prints the
tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import report
from bench.analysis import BASELINE, TORCHSERVE, WEIR, WEIR_ARCHIVES, Point, fastest, targets
from bench.machine import load_average, machine_info, timestamp
from bench.memory import MIB, PeakRss
from bench.peer_report import peer_targets
from bench.peers import DEFAULT_PEERS, PeerFactory, parse_peers, prepare_peers
from bench.points import Contender, PointRunner, Schedule, Workload
from bench.servers import ROOT, ServerProcess, weir_server
from bench.variants import RUNTIMES, Runtime, Variant, parse_runtimes, plan
from bench.workload import bench_repository, weights_bytes, write_body
from bench.wrk import ensure_wrk
from weir.redis_server import free_port
from weir.settings import WorkerSettings

logger = logging.getLogger("bench")

MODELS = "tiny_mlp,wide_mlp,bert_mini"
CONCURRENCY = "1,8,32,64"
RUNTIME_NAMES = ",".join(RUNTIMES)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--models", default=MODELS, help=f"comma-separated (default {MODELS})")
    parser.add_argument("--concurrency", default=CONCURRENCY, help=f"default {CONCURRENCY}")
    parser.add_argument("--duration-s", type=int, default=8, help="measured seconds per point")
    parser.add_argument("--warmup-s", type=int, default=3, help="warm-up seconds per point")
    parser.add_argument(
        "--rounds", type=int, default=2, help="runs per point and server; the best is kept"
    )
    parser.add_argument(
        "--runtimes",
        type=_runtimes,
        default=RUNTIME_NAMES,
        help=f"comma-separated (default {RUNTIME_NAMES}); ONNX Runtime and OpenVINO serve "
        "wide_mlp and bert_mini; the baseline runs with torch",
    )
    parser.add_argument(
        "--peers",
        type=_peers,
        default=DEFAULT_PEERS,
        help=f"comma-separated servers Weir is measured against, torch only (default "
        f"{DEFAULT_PEERS}; weir-archives: Weir serving TorchServe's archives and "
        "config.properties through /predictions; none: Weir alone)",
    )
    parser.add_argument("--raw-s", type=float, default=1.0, help="timed seconds per batch size")
    parser.add_argument("--repository", type=Path, default=ROOT / "examples" / "models")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def _runtimes(text: str) -> list[Runtime]:
    try:
        return parse_runtimes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _peers(text: str) -> list[str]:
    try:
        return parse_peers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def worker_threads() -> int:
    """The torch thread count a `weir up` worker gets (from WEIR_WORKER_*); 0: torch's own."""
    settings = WorkerSettings()  # type: ignore[call-arg]  # pydantic-settings fills it in
    return settings.torch_threads


def ensure_models(repository: Path, models: list[str]) -> None:
    if all((repository / m / "1" / "model.pt").is_file() for m in models):
        return
    builder = ROOT / "examples" / "build_models.py"
    subprocess.run([sys.executable, str(builder), "--repository", str(repository)], check=True)


def measure_raw(repository: Path, models: list[str], threads: int, raw_s: float) -> Any:
    command = [sys.executable, "-m", "bench.raw", "--repository", str(repository)]
    command += ["--models", ",".join(models), "--threads", str(threads), "--min-s", str(raw_s)]
    # stdout carries the JSON; the subprocess's log lines go through to ours on stderr.
    done = subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout)


def schedule(args: argparse.Namespace) -> Schedule:
    concurrency = [int(c) for c in args.concurrency.split(",")]
    return Schedule(concurrency, args.warmup_s, args.duration_s, args.rounds)


class Servers:
    """The servers of one run: Weir always; the peers asked for when torch is measured."""

    def __init__(
        self,
        weir: ServerProcess,
        baseline: ServerProcess | None,
        torchserve: ServerProcess | None = None,
        archives: ServerProcess | None = None,
    ) -> None:
        self.weir = weir
        self.baseline = baseline
        self.torchserve = torchserve
        self.archives = archives  # Weir serving TorchServe's archives

    @property
    def all(self) -> list[ServerProcess]:
        chosen = (self.baseline, self.weir, self.torchserve, self.archives)
        return [s for s in chosen if s is not None]

    def contenders(self, runtime: Runtime) -> list[Contender]:
        """Who serves a model through ``runtime``, in the order a round measures them."""
        if runtime != Runtime.TORCH:
            return [Contender(self.weir, runtime)]
        return [Contender(server, runtime) for server in self.all]


def workloads(
    models: list[str], variants: list[Variant], bodies: dict[str, Path], servers: Servers
) -> list[Workload]:
    """Per model, who serves it: the baseline and Weir through torch, Weir through the rest."""
    work = []
    for model in models:
        contenders = [
            contender
            for v in variants
            if v.model == model
            for contender in servers.contenders(v.runtime)
        ]
        work.append(Workload(model, bodies[model], contenders))
    return work


def make_servers(
    args: argparse.Namespace, peers: PeerFactory, threads: int, worker_total: int
) -> Servers:
    """Weir, and the peers asked for when torch is measured (they serve torch only)."""
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    weir = weir_server(peers.repository, free_port(), args.out / "logs" / "weir.log")
    if Runtime.TORCH not in args.runtimes:
        return Servers(weir, None)
    baseline = peers.baseline(threads) if BASELINE in args.peers else None
    torchserve = peers.torchserve(worker_total) if TORCHSERVE in args.peers else None
    archives = peers.weir_archives(worker_total) if WEIR_ARCHIVES in args.peers else None
    return Servers(weir, baseline, torchserve, archives)


def serve_and_measure(
    args: argparse.Namespace, peers: PeerFactory, threads: tuple[int, int], work: Path
) -> tuple[list[Point], dict[str, PeakRss]]:
    """Every point; ``threads``: a Weir worker's torch threads setting, and their number."""
    models = args.models.split(",")
    variants = plan(models, args.runtimes)
    # The torch model's body: every variant takes the same tensors.
    bodies = {m: write_body(args.repository, m, work / f"{m}.json") for m in models}
    servers = make_servers(args, peers, *threads)
    with contextlib.ExitStack() as stack:
        for server in servers.all:
            stack.callback(server.stop)
            server.start()
        for server in servers.all:
            server.wait_ready()
        runner = PointRunner(servers.all, schedule(args))
        # Every server's tree is sampled for the whole run (its peak is under its own load)
        # and for the last time before the servers stop (the stack unwinds in reverse).
        rss = {s.name: stack.enter_context(PeakRss(s.pid)) for s in servers.all}
        points = runner.run(workloads(models, variants, bodies, servers))
    return points, rss


def memory_record(
    rss: dict[str, PeakRss], repository: Path, runtimes: list[Runtime]
) -> dict[str, Any]:
    """Weir's peak resident memory, less the model files; each peer's peak beside it."""
    weights = weights_bytes(repository)
    weir = rss[WEIR]
    return {
        "runtimes": [str(r) for r in runtimes],
        **_peak_record(weir),
        "weights_mib": weights / MIB,
        "peak_minus_weights_mib": (weir.peak_bytes - weights) / MIB,
        "peers": {name: _peak_record(peak) for name, peak in rss.items() if name != WEIR},
    }


def _peak_record(rss: PeakRss) -> dict[str, Any]:
    return {
        "peak_total_mib": rss.peak_bytes / MIB,
        "processes": [{"label": n, "rss_mib": b / MIB} for n, b in rss.at_peak],
    }


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Check the tools and models; the machine's description, with its load before the run."""
    ensure_wrk()
    ensure_models(args.repository, args.models.split(","))
    if Runtime.TORCH in args.runtimes:
        prepare_peers(args.peers)
    machine = machine_info()
    if machine["load_avg_start"][0] > 0.5:
        load = machine["load_avg_start"]
        logger.warning("load average %s before the run: expect noisy numbers", load)
    return machine


def measure_all(args: argparse.Namespace, machine: dict[str, Any]) -> dict[str, Any]:
    started = timestamp()
    variants = plan(args.models.split(","), args.runtimes)
    if not variants:
        raise SystemExit(f"no model of {args.models} is served through {args.runtimes}")
    names = [v.name for v in variants]
    threads = worker_threads()
    with tempfile.TemporaryDirectory(prefix="weir-bench-") as work:
        repository = bench_repository(
            args.repository, variants, args.out / "repository", args.out / "variants"
        )
        logger.info("raw limit of %s, threads %s", ", ".join(names), threads or "default")
        raw_before = measure_raw(repository, names, threads, args.raw_s)
        peers = PeerFactory(repository, args.models.split(","), args.out)
        worker_total = int(raw_before["threads"])
        points, rss = serve_and_measure(args, peers, (threads, worker_total), Path(work))
        logger.info("raw limit again, after the servers")
        raw_after = measure_raw(repository, names, threads, args.raw_s)
        memory = memory_record(rss, repository, args.runtimes)
        memory["models"] = args.models.split(",")
    raw = {
        "torch_threads": raw_before["torch_threads"],
        "threads": raw_before["threads"],
        "models": fastest(raw_before["models"], raw_after["models"]),
        "before": raw_before["models"],
        "after": raw_after["models"],
    }
    return {
        "date": started,
        "machine": {**machine, "load_avg_end": load_average()},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "raw": raw,
        "points": [asdict(p) for p in points],
        "memory": memory,
        "peers": peers.record,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.repository, args.out = args.repository.resolve(), args.out.resolve()
    record = measure_all(args, prepare(args))
    write_outputs(args.out, record)


def write_outputs(out: Path, record: dict[str, Any]) -> None:
    points = [Point(**p) for p in record["points"]]
    memory = record["memory"]
    found = targets(points, record["raw"]["models"], memory["peak_minus_weights_mib"])
    found += peer_targets(points, memory)
    record["targets"] = [t.as_dict() for t in found]
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / f"{record['date'].replace(':', '')}.json", record)
    table = report.markdown(record, points, found)
    (out / "latest.md").write_text(table)
    models = list(dict.fromkeys(p.model for p in points))
    # matplotlib is the bench extra's (make bench installs it): imported only to draw.
    from bench.plot import save_plot

    save_plot(out / "latest.png", points, record["raw"]["models"], models)
    logger.info("wrote %s, latest.md and latest.png in %s", record["date"], out)
    print(table)


if __name__ == "__main__":
    main()
