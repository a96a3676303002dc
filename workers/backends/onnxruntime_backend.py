"""ONNX Runtime backend: ``model.onnx`` (Triton's ``onnxruntime`` / ``onnxruntime_onnx``).

One ``InferenceSession`` per model and device (the CPU or one CUDA device), shared by the
model's instances there: ``run`` is thread-safe, so the weights are in memory (or on the
device) once. Inputs and outputs bind by name. Threads: the config parameter
``intra_op_thread_count`` (Triton's name) when set, else the worker's threads divided among
the model's instances, so its instances side by side never run more threads than the worker
has (on a CUDA device too); ``inter_op_thread_count`` (default 1) and ``execution_mode``
(0 sequential, 1 parallel) as Triton reads them. The pool's threads do not spin between
batches (``session.intra_op.allow_spinning`` 0, as ``OMP_WAIT_POLICY=PASSIVE`` does for
torch: a spinning thread holds a core the gateway and Redis need); any ``session.*``
parameter is passed to ONNX Runtime as a session config entry and overrides that.

``optimization.graph.level``: Triton's -1 basic, 1 extended, 2 none; unset, all.
``enable_mem_arena`` / ``enable_mem_pattern``: 0 or 1. ``memory.enable_memory_arena_shrinkage``
goes to each run's options. The execution providers and their options come from
:mod:`workers.backends.onnxruntime_providers`: on a CUDA device TensorRT's (when the config's
``gpu_execution_accelerator`` names ``tensorrt``), CUDA's, then the CPU's.

On a CUDA device the batches stay numpy arrays: ONNX Runtime copies the inputs to the device
and the outputs back itself, so this backend keeps no CUDA stream of its own per instance
(each instance calls the one session). ONNX Runtime's Python API would fall back to the CPU
when a GPU provider fails to start, and it skips one it cannot create (its libraries
missing) with only a line in its log: here the session has no fallback, and a session
without every provider it was given fails the load, naming the missing ones.

BYTES tensors reach the model as strings (UTF-8) and come back as bytes. BF16 cannot cross
ONNX Runtime's Python API as numpy and is refused at load.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from weir.config import ModelConfig
from weir.errors import ConfigError, InvalidInput
from workers.backends.base import RuntimeBackend
from workers.backends.onnxruntime_providers import Provider
from workers.backends.onnxruntime_providers import providers as providers  # bench/raw.py's too

logger = logging.getLogger(__name__)

GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
SPINNING = "session.intra_op.allow_spinning"
SHRINKAGE = "memory.enable_memory_arena_shrinkage"


class OnnxRuntimeBackend(RuntimeBackend):
    """An ONNX model in one session per device, shared by the model's instances there."""

    runtime = "ONNX Runtime"

    def load(self) -> None:
        config = self.config
        options = session_options(config, max(self.share.total // self.instances, 1))
        chosen = providers(config, self.device)
        if self.device is None:
            self.session = ort.InferenceSession(str(self.path), options, providers=chosen)
        else:
            self.session = _gpu_session(config, self.path, options, chosen, self.device)
        self.run_options = run_options(config)
        self.output_names = [spec.name for spec in config.output]
        self.feeders = _feeders(config, self.path, self.session)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {name: self.feeders[name](array) for name, array in inputs.items()}
        with self.share.computing():  # counted, so torch models beside it take fewer threads
            results = self.session.run(self.output_names, feed, self.run_options)
        return {
            name: _from_runtime(value)
            for name, value in zip(self.output_names, results, strict=True)
        }


def session_options(config: ModelConfig, default_threads: int) -> ort.SessionOptions:
    """The session's options from the config's parameters and ``optimization``."""
    params = config.parameters
    options = ort.SessionOptions()
    options.intra_op_num_threads = _int(config, "intra_op_thread_count", 0) or default_threads
    options.inter_op_num_threads = _int(config, "inter_op_thread_count", 0) or 1
    if _int(config, "execution_mode", 0) == 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    level = (
        config.optimization.graph.level if config.optimization and config.optimization.graph else 0
    )
    options.graph_optimization_level = GRAPH_LEVELS.get(
        level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    if "enable_mem_arena" in params:
        options.enable_cpu_mem_arena = _int(config, "enable_mem_arena", 1) == 1
    if "enable_mem_pattern" in params:
        options.enable_mem_pattern = _int(config, "enable_mem_pattern", 1) == 1
    options.add_session_config_entry(SPINNING, "0")
    for key, value in params.items():
        if key.startswith("session."):
            options.add_session_config_entry(key, value)
    options.log_severity_level = 3  # errors only: ORT's warnings go to stderr, not our log
    return options


def run_options(config: ModelConfig) -> ort.RunOptions | None:
    value = config.parameters.get(SHRINKAGE)
    if not value:
        return None
    options = ort.RunOptions()
    options.add_run_config_entry(SHRINKAGE, value)
    return options


def _gpu_session(
    config: ModelConfig,
    path: Path,
    options: ort.SessionOptions,
    chosen: list[Provider],
    device: int,
) -> ort.InferenceSession:
    """A session on CUDA device ``device`` that has every GPU provider it was given.

    ONNX Runtime's Python API retries on the CPU when a GPU provider fails to start and
    skips one it cannot create (its libraries missing), saying so only in its log: neither
    may turn a GPU instance into a CPU one here.
    """
    _load_cuda_libraries()
    session = ort.InferenceSession(str(path), options, providers=chosen, enable_fallback=0)
    session.disable_fallback()  # nor move to the CPU after a run fails on the device
    names = [p if isinstance(p, str) else p[0] for p in chosen]
    missing = [name for name in names if name not in session.get_providers()]
    if missing:
        raise ConfigError(
            f"{path}: ONNX Runtime could not start {', '.join(missing)} on CUDA device "
            f"{device} for model {config.name} (the session has "
            f"{', '.join(session.get_providers())}): the CUDA, cuDNN (and for TensorRT, "
            "TensorRT) libraries it loads must be on the library path"
        )
    return session


@functools.cache
def _load_cuda_libraries() -> None:
    """Load NVIDIA's CUDA and cuDNN libraries for ONNX Runtime's CUDA provider, once.

    ``onnxruntime.preload_dlls`` (onnxruntime-gpu 1.21 on) loads those of NVIDIA's pip
    packages, which torch's CUDA wheels bring; an older ONNX Runtime finds them only if torch
    loaded them first or they are on the library path.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()


def _int(config: ModelConfig, key: str, default: int) -> int:
    raw = config.parameters.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"model {config.name}: parameter {key} must be a whole number, got {raw!r}"
        ) from None


def _feeders(
    config: ModelConfig, path: Path, session: ort.InferenceSession
) -> dict[str, Callable[[np.ndarray], Any]]:
    """Per config input, what turns the batch array into what the session takes."""
    session_inputs = {arg.name: arg for arg in session.get_inputs()}
    session_outputs = {arg.name for arg in session.get_outputs()}
    for spec in config.output:
        if spec.name not in session_outputs:
            raise ConfigError(f"{path}: the session has no output {spec.name!r}")
    feeders: dict[str, Callable[[np.ndarray], Any]] = {}
    for spec in (*config.input, *config.output):
        if spec.datatype == "BF16":
            raise ConfigError(
                f"{path}: tensor {spec.name!r} is BF16, which ONNX Runtime's Python API "
                "cannot exchange as numpy"
            )
    for spec in config.input:
        if spec.name not in session_inputs:
            raise ConfigError(f"{path}: the session has no input {spec.name!r}")
        feeders[spec.name] = _to_strings if spec.datatype == "BYTES" else _as_is
    return feeders


def _as_is(array: np.ndarray) -> np.ndarray:
    return array


def _to_strings(array: np.ndarray) -> np.ndarray:
    """BYTES elements as the ``str`` ONNX Runtime's string tensors hold."""
    try:
        decoded = [e.decode() if isinstance(e, bytes) else str(e) for e in array.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"a BYTES element is not UTF-8, as a string tensor needs: {exc}"
        ) from None
    out = np.empty(len(decoded), dtype=object)
    out[:] = decoded
    return out.reshape(array.shape)


def _from_runtime(value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind in "OU":  # string outputs: Triton's BYTES are bytes
        encoded = np.empty(array.size, dtype=object)
        encoded[:] = [e.encode() if isinstance(e, str) else e for e in array.reshape(-1)]
        return encoded.reshape(array.shape)
    return array
