"""The raw limit: each model's samples/s in-process, its runtime alone, no serving.

Runs as its own process (``python -m bench.raw``) so its settings match a fresh worker's, and
prints one JSON object on stdout. Each model runs through the runtime its config names, set up
as Weir's backend sets it up: torch (``torch.jit.load`` of ``model.pt``, ``inference_mode``),
ONNX Runtime (a session with the backend's ``session_options`` and ``run_options``) or
OpenVINO (compiled for the CPU with the backend's ``compile_properties``). Every runtime runs
one batch at a time on every thread a worker has, as one instance alone would: the backend
splits those threads only between instances computing side by side.

Each batch size is warmed up first: TorchScript's profiling executor specialises on the
shapes it has seen, and the first calls at a new shape are many times slower than the rest.
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

from bench.variants import VERSION
from bench.workload import read_inputs, sample
from weir.autocomplete import model_path
from weir.config import Backend, ModelConfig, load_config
from workers.threads import available_cores

logger = logging.getLogger(__name__)

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# The profiling executor needs about 20 calls at the first shape it sees before it settles.
WARMUP_CALLS = 20

Inputs = dict[str, np.ndarray]
# A loaded model: given one batch's inputs, the call that runs it.
Prepare = Callable[[Inputs], Callable[[], object]]


def call_times(call: Callable[[], object], min_calls: int, min_s: float) -> list[float]:
    """Seconds per call, calling until both ``min_calls`` and ``min_s`` are reached."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_calls or time.perf_counter() - start < min_s:
        before = time.perf_counter()
        call()
        times.append(time.perf_counter() - before)
    return times


def measure_batch(call: Callable[[], object], min_s: float, warmup_calls: int = 3) -> float:
    """Seconds per call once warm: the 20th percentile of the calls timed.

    Another program on the machine only ever adds time, and with the runtime's threads on
    every core, a call waits whenever one core is taken, so the median on a shared machine
    can be many times the undisturbed time. A low percentile keeps the limit a limit.
    """
    with torch.inference_mode():  # torch's; the other runtimes ignore it
        call_times(call, min_calls=warmup_calls, min_s=min_s / 2)
        times = call_times(call, min_calls=5, min_s=min_s)
    return statistics.quantiles(times, n=5)[0]


def torch_model(version_dir: Path, config: ModelConfig, threads: int) -> Prepare:
    """TorchScript, its inputs in config order; torch's threads are set once per process."""
    path = str(model_path(config, version_dir))
    module = torch.jit.load(path, map_location="cpu")  # type: ignore[no-untyped-call]
    module.eval()

    def prepare(inputs: Inputs) -> Callable[[], object]:
        args = [torch.from_numpy(inputs[spec.name]) for spec in config.input]
        return lambda: module(*args)

    return prepare


def onnxruntime_model(version_dir: Path, config: ModelConfig, threads: int) -> Prepare:
    """One session with the options Weir's ONNX Runtime backend gives one instance."""
    import onnxruntime as ort

    from workers.backends import onnxruntime_backend as backend

    options = backend.session_options(config, threads)
    path = str(model_path(config, version_dir))
    session = ort.InferenceSession(path, options, providers=backend.providers(config))
    outputs = [spec.name for spec in config.output]
    run_options = backend.run_options(config)
    return lambda inputs: lambda: session.run(outputs, inputs, run_options)


def openvino_model(version_dir: Path, config: ModelConfig, threads: int) -> Prepare:
    """The IR compiled as Weir's OpenVINO backend compiles it for one instance (one stream).

    The benchmark's IR has a dynamic batch dimension already, so the backend's reshape of a
    fixed one does not apply.
    """
    import openvino as ov

    from workers.backends.openvino_backend import DEVICE, compile_properties

    core = ov.Core()
    model = core.read_model(str(model_path(config, version_dir)))
    compiled = core.compile_model(model, DEVICE, compile_properties(core, config, threads, 1))
    request = compiled.create_infer_request()
    return lambda inputs: lambda: request.infer(inputs, share_outputs=False)


LOADERS: dict[Backend, Callable[[Path, ModelConfig, int], Prepare]] = {
    Backend.PYTORCH: torch_model,
    Backend.ONNXRUNTIME: onnxruntime_model,
    Backend.OPENVINO: openvino_model,
}


def load_model(repository: Path, model: str, threads: int) -> Prepare:
    """``model`` of ``repository`` through the runtime its config names."""
    config = load_config(repository / model / "config.yaml", model)
    loader = LOADERS.get(config.backend)
    if loader is None:
        raise ValueError(f"{model}: the raw limit cannot run backend {config.backend}")
    return loader(repository / model / VERSION, config, threads)


def measure_model(
    repository: Path, model: str, batch_sizes: tuple[int, ...], min_s: float, threads: int
) -> list[dict[str, float]]:
    prepare = load_model(repository, model, threads)
    specs = read_inputs(repository, model)
    points: list[dict[str, float]] = []
    for batch_size in batch_sizes:
        rng = np.random.default_rng(batch_size)
        call = prepare({spec.name: sample(spec, rng, batch_size) for spec in specs})
        # Only the first shape a model sees needs the long warm-up.
        batch_s = measure_batch(call, min_s, WARMUP_CALLS if not points else 3)
        rate = batch_size / batch_s
        points.append({"batch_size": batch_size, "batch_ms": batch_s * 1e3, "samples_per_s": rate})
        logger.info(
            "raw %s batch %d: %.3f ms, %.1f samples/s", model, batch_size, batch_s * 1e3, rate
        )
    return points


def measure(
    repository: Path, models: list[str], threads: int, batch_sizes: tuple[int, ...], min_s: float
) -> dict[str, Any]:
    """Every model's curve; ``threads``: torch's, and the other runtimes' (0: every core)."""
    if threads:
        torch.set_num_threads(threads)
    total = threads or available_cores()  # what a worker's threads add up to
    results = {m: measure_model(repository, m, batch_sizes, min_s, total) for m in models}
    return {"torch_threads": torch.get_num_threads(), "threads": total, "models": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="raw throughput per batch size, each model through its runtime"
    )
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--models", required=True, help="comma-separated model names")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads, 0: torch's default, every core for the others",
    )
    parser.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    parser.add_argument("--min-s", type=float, default=1.0, help="timed seconds per batch size")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    result = measure(args.repository, args.models.split(","), args.threads, sizes, args.min_s)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
