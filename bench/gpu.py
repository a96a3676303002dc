"""The benchmark's GPU section: how close Weir's mesh gets to each runtime's limit on one GPU.

Run as ``python -m bench.gpu --out DIR`` on a machine with a CUDA GPU (``--cpu`` checks the
plumbing on one without). For each runtime that can run here, torch always, ONNX Runtime
where it has the CUDA execution provider, TensorRT where ``tensorrt`` imports (a line names
each runtime skipped and why), and for each model (``bert_mini``, ``bert_base``; see
:mod:`bench.gpu_models` for how they are built), it measures:

- the **raw limit**: one instance of Weir's own backend on the GPU, in this process, at
  batches of 1, 8, 32 and 64 rows; the best rows/s and its batch size
  (:func:`bench.gpu_models.raw_limit`). It is taken before that runtime's mesh starts, and
  freed before it, so nothing else computes on the GPU meanwhile.
- **Weir's mesh**: a private redis-server, one batcher, ``--gpu-workers`` ``weir worker
  --pool gpu`` processes (the model's two instances on the GPU, torch's threads left at its
  default) and ``--gateways`` gateway processes sharing one port (``WEIR_GATEWAY_PROCESSES``),
  each service a ``python -m weir.cli`` process in its own session, configured through the
  environment as the chaos tests' Topology does. It is ready when ``/v2/health/ready`` and
  each model's ``/v2/models/<m>/ready`` answer 200. Each model first gets ``--warmup-s`` of
  load at the largest concurrency, not counted (the runtime's first calls at each batch
  size). Then, per concurrency (``--concurrency``, 1, 8, 64, 256), a closed loop of that
  many keep-alive connections (:mod:`bench.http_load`, in ``--load-processes`` processes)
  POSTs one row per request (``input_ids`` [1, 128] INT64 as KServe v2 JSON) for
  ``--warmup-s``, not counted, then ``--duration-s``, counted: req/s, p50 and p99 latency,
  failed requests, and req/s as a percentage of the raw limit.

One mesh per runtime serves that runtime's models, and is stopped (SIGTERM, then SIGKILL for
whatever of its session is left after a grace period) before the next starts, on errors too.
A runtime that fails (a build, a load, a mesh that is never ready) is reported with its error
and the others still run; the exit status is then 1. It prints a markdown table and writes it
to ``DIR/gpu.md``, every number to ``DIR/gpu.json``, and the services' logs to
``DIR/gpu-logs/<runtime>/``.

The raw limit is one instance running one batch at a time; the mesh runs two instances whose
batches overlap on their own CUDA streams, so it can pass 100 %.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.pool import Pool
from pathlib import Path
from types import FrameType
from typing import Any

from bench import gpu_models, http_load
from bench.gpu_models import RawLimit, Served
from weir.redis_server import RedisServer, free_port

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
CPU_RAW_BATCH_SIZES = (1, 8)  # --cpu: a plumbing check, not a measurement
READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 20.0
POLL_S = 0.2


class Mesh:
    """Weir's services as processes against a private Redis, serving one repository."""

    def __init__(self, repository: Path, log_dir: Path, args: argparse.Namespace) -> None:
        self.repository = repository
        self.log_dir = log_dir
        self.args = args
        self.redis = RedisServer()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.url = ""

    def __enter__(self) -> Mesh:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        self.redis.start()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.spawn("batcher", ["batcher"])
        pool = "cpu" if self.args.cpu else "gpu"
        for index in range(self.args.gpu_workers):
            self.spawn(f"worker-{index}", ["worker", "--pool", pool])
        self.spawn(
            "gateway",
            ["gateway"],
            WEIR_GATEWAY_HTTP_PORT=str(port),
            WEIR_GATEWAY_PROCESSES=str(self.args.gateways),
        )

    def spawn(self, name: str, command: list[str], **env: str) -> None:
        environment = {
            **os.environ,
            "WEIR_REDIS_URL": self.redis.url,
            "WEIR_REPOSITORY": str(self.repository),
            "WEIR_GATEWAY_HOST": "127.0.0.1",
            "WEIR_GATEWAY_METRICS_PORT": "0",
            "WEIR_GATEWAY_GRPC_PORT": "0",
            **env,
        }
        with (self.log_dir / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", "weir.cli", *command],
                env=environment,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: nothing of it outlives stop()
            )

    def wait_ready(self, models: list[str], timeout_s: float = READY_TIMEOUT_S) -> float:
        """Seconds until the mesh and every model are ready; RuntimeError if never."""
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
        start = time.monotonic()
        while not all(_ok(self.url + path) for path in paths):
            self._check_alive()
            if time.monotonic() - start > timeout_s:
                raise RuntimeError(f"the mesh is not ready after {timeout_s:.0f} s")
            time.sleep(POLL_S)
        return time.monotonic() - start

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM to each service, then SIGKILL to what is left of its session."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(deadline - time.monotonic(), 0.1))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self.redis.stop()


# No proxy from the environment: the mesh is on loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Results:
    """Everything the run measured, and what it skipped or lost."""

    raw: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    build_s: dict[str, float] = field(default_factory=dict)
    ready_s: dict[str, float] = field(default_factory=dict)
    section_s: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def point_row(served: Served, limit: RawLimit, result: http_load.LoadResult) -> dict[str, Any]:
    return {
        "model": served.model,
        "runtime": served.runtime,
        "served_as": served.name,
        **result.as_dict(),
        "raw_rows_per_s": limit.rows_per_s,
        "raw_batch_size": limit.batch_size,
        "percent_of_raw": 100 * result.requests_per_s / limit.rows_per_s,
    }


def measure_model(
    pool: Pool, url: str, served: Served, limit: RawLimit, args: argparse.Namespace
) -> Iterator[dict[str, Any]]:
    """Every concurrency point of one served model, as each is measured."""
    target = http_load.Target.of(
        f"{url}/v2/models/{served.name}/infer", gpu_models.request_body(served)
    )
    if args.warmup_s > 0:
        # Not counted: the runtime's first calls at each batch size (TorchScript's profiling
        # runs, CUDA libraries' set-up) fall here rather than in the first point.
        burst = max(args.concurrency)
        http_load.run(pool, target, burst, args.warmup_s, 0.0, args.load_processes)
    for concurrency in args.concurrency:
        result = http_load.run(
            pool, target, concurrency, args.duration_s, args.warmup_s, args.load_processes
        )
        logger.info(
            "%s at %d: %.1f req/s, p50 %.2f ms, p99 %.2f ms, %d failed",
            served.name, concurrency, result.requests_per_s, result.p50_ms, result.p99_ms,
            result.failures,
        )  # fmt: skip
        yield point_row(served, limit, result)


def raw_limits(served: list[Served], args: argparse.Namespace) -> dict[str, RawLimit]:
    device = None if args.cpu else 0
    sizes = tuple(args.raw_batches) if args.raw_batches else (
        CPU_RAW_BATCH_SIZES if args.cpu else gpu_models.RAW_BATCH_SIZES
    )  # fmt: skip
    limits = {}
    for item in served:
        limits[item.model] = gpu_models.raw_limit(item, device, sizes, args.raw_min_s)
        logger.info(
            "raw %s: %.1f rows/s at batch %d",
            item.name, limits[item.model].rows_per_s, limits[item.model].batch_size,
        )  # fmt: skip
    return limits


def run_runtime(
    runtime: str, root: Path, pool: Pool, args: argparse.Namespace, results: Results
) -> None:
    """One runtime: its models built, their raw limits, then its mesh under load."""
    start = time.monotonic()
    served = gpu_models.prepare(root, runtime, args.models, args.cpu)
    results.build_s[runtime] = time.monotonic() - start
    limits = raw_limits(served, args)
    results.raw[runtime] = {model: limit.as_dict() for model, limit in limits.items()}
    with Mesh(served[0].repository, args.out / "gpu-logs" / runtime, args) as mesh:
        results.ready_s[runtime] = mesh.wait_ready([item.name for item in served])
        logger.info("%s mesh ready in %.1f s", runtime, results.ready_s[runtime])
        for item in served:  # each point kept as it comes: an interrupted run reports it
            results.points.extend(measure_model(pool, mesh.url, item, limits[item.model], args))
    results.section_s[runtime] = time.monotonic() - start


def run_all(root: Path, args: argparse.Namespace, results: Results) -> None:
    """Every runtime that can run here, in turn; one's failure leaves the others' numbers."""
    reasons = {runtime: gpu_models.skip_reason(runtime, args.cpu) for runtime in args.runtimes}
    results.skipped = {runtime: why for runtime, why in reasons.items() if why}
    with http_load.load_pool(args.load_processes) as pool:
        for runtime in (r for r in args.runtimes if r not in results.skipped):
            try:
                run_runtime(runtime, root, pool, args, results)
            except Exception as exc:
                logger.error("%s failed:\n%s", runtime, traceback.format_exc())
                results.failed[runtime] = f"{type(exc).__name__}: {exc}"
            except BaseException:  # SIGTERM or Ctrl-C: the report keeps what was measured
                results.failed[runtime] = "interrupted"
                raise


# --- the report -----------------------------------------------------------------------------

HEADER = (
    "| model | runtime | concurrency | req/s | p50 ms | p99 ms | failed "
    "| raw limit rows/s (batch) | % of raw |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def table(results: Results) -> str:
    lines = [HEADER]
    for row in results.points:
        lines.append(
            f"| {row['model']} | {row['runtime']} | {row['concurrency']} "
            f"| {row['requests_per_s']:.1f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} "
            f"| {row['failures']} | {row['raw_rows_per_s']:.1f} ({row['raw_batch_size']}) "
            f"| {row['percent_of_raw']:.0f} % |"
        )
    return "\n".join(lines)


def notes(results: Results) -> str:
    skipped = "; ".join(f"{name}: {why}" for name, why in results.skipped.items())
    lines = [f"Skipped: {skipped or 'none'}."]
    lines += [f"Failed: {name}: {why}" for name, why in results.failed.items()]
    return "\n".join(lines)


def machine(cpu: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"cores": os.cpu_count(), "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if not cpu:
            info["gpu"] = torch.cuda.get_device_name(0)
    for name in ("onnxruntime", "tensorrt"):
        module = sys.modules.get(name)
        if module is not None:
            info[name] = getattr(module, "__version__", "?")
    return info


def report(results: Results, args: argparse.Namespace) -> str:
    about = machine(args.cpu)
    shown = ", ".join(f"{key} {value}" for key, value in about.items())
    text = f"{table(results)}\n\n{notes(results)}\nMachine: {shown}.\n"
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    document = {"machine": about, "settings": settings, **vars(results)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.md").write_text(text)
    (args.out / "gpu.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    return text


# --- the command ----------------------------------------------------------------------------


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Weir on one GPU against each runtime's limit")
    parser.add_argument("--out", type=Path, required=True, help="where the table and JSON go")
    parser.add_argument("--repository", type=Path, help="build (and keep) the models here")
    parser.add_argument("--models", type=_names, default=list(gpu_models.MODELS))
    parser.add_argument("--runtimes", type=_names, default=list(gpu_models.RUNTIMES))
    parser.add_argument("--concurrency", type=_numbers, default=[1, 8, 64, 256])
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured, per point")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="not counted, per point")
    parser.add_argument("--raw-min-s", type=float, default=1.0, help="timed, per batch size")
    parser.add_argument("--raw-batches", type=_numbers, help="batch sizes of the raw limit")
    parser.add_argument("--gateways", type=int, default=4, help="gateway processes")
    parser.add_argument("--gpu-workers", type=int, default=1, help="worker pool processes")
    parser.add_argument(
        "--load-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2))
    )
    parser.add_argument("--cpu", action="store_true", help="no GPU: check the plumbing")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in gpu_models.MODELS] + [
        r for r in args.runtimes if r not in gpu_models.RUNTIMES
    ]
    if unknown:
        parser.error(f"unknown models or runtimes: {', '.join(unknown)}")
    return args


@contextlib.contextmanager
def _root(repository: Path | None) -> Iterator[Path]:
    if repository is not None:
        repository.mkdir(parents=True, exist_ok=True)
        yield repository
        return
    with tempfile.TemporaryDirectory(prefix="weir-bench-gpu-") as tmp:
        yield Path(tmp)


def _exit_on_sigterm(signum: int, _: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every ``with``: the services stop


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    gpu_models.check_device(args.cpu)
    results = Results()
    try:
        with _root(args.repository) as root:
            run_all(root, args, results)
    finally:
        print(report(results, args))
    return 1 if results.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
