"""The raw limit: each model's samples/s in-process, torch alone, no serving.

Runs as its own process (``python -m bench.raw``) so its torch settings match a fresh worker's,
and prints one JSON object on stdout. Each batch size is warmed up first: TorchScript's
profiling executor specialises on the shapes it has seen, and the first calls at a new shape
are many times slower than the rest.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.workload import read_inputs, sample

logger = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# The profiling executor needs about 20 calls at the first shape it sees before it settles.
WARMUP_CALLS = 20


def call_times(call: Callable[[], object], min_calls: int, min_s: float) -> list[float]:
    """Seconds per call, calling until both ``min_calls`` and ``min_s`` are reached."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_s:
        before = time.perf_counter()
        call()
        times.append(time.perf_counter() - before)
    return times


def measure_batch(
    module: Any, args: list[torch.Tensor], min_s: float, warmup_calls: int = 3
) -> float:
    """Seconds per call once warm: the 20th percentile of the calls timed.

    Another program on the machine only ever adds time, and with torch's threads on every
    core, a call waits whenever one core is taken, so the median on a shared machine can be
    many times the undisturbed time. A low percentile keeps the limit a limit.
    """
    with torch.inference_mode():
        call_times(lambda: module(*args), min_calls=warmup_calls, min_s=min_s / 2)
        times = call_times(lambda: module(*args), min_calls=5, min_s=min_s)
    return statistics.quantiles(times, n=5)[0]


def measure_model(
    repository: Path, model: str, batch_sizes: tuple[int, ...], min_s: float
) -> list[dict[str, float]]:
    path = repository / model / "1" / "model.pt"
    module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    module.eval()
    specs = read_inputs(repository, model)
    points: list[dict[str, float]] = []
    for batch_size in batch_sizes:
        rng = np.random.default_rng(batch_size)
        args = [torch.from_numpy(sample(spec, rng, batch_size)) for spec in specs]
        # Only the first shape a module sees needs the long warm-up.
        batch_s = measure_batch(module, args, min_s, WARMUP_CALLS if not points else 3)
        rate = batch_size / batch_s
        points.append({"batch_size": batch_size, "batch_ms": batch_s * 1e3, "samples_per_s": rate})
        logger.info(
            "raw %s batch %d: %.3f ms, %.1f samples/s", model, batch_size, batch_s * 1e3, rate
        )
    return points


def measure(
    repository: Path, models: list[str], threads: int, batch_sizes: tuple[int, ...], min_s: float
) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    results = {m: measure_model(repository, m, batch_sizes, min_s) for m in models}
    return {"torch_threads": torch.get_num_threads(), "models": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="raw torch throughput per batch size")
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--models", required=True, help="comma-separated model names")
    parser.add_argument("--threads", type=int, default=0, help="torch threads, 0: torch default")
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--min-s", type=float, default=1.0, help="timed seconds per batch size")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    result = measure(args.repository, args.models.split(","), args.threads, sizes, args.min_s)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
