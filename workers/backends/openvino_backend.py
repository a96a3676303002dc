"""OpenVINO backend: IR models (``model.xml`` + ``model.bin``, Triton's ``openvino``), on CPU.

Weir runs OpenVINO on the CPU only: OpenVINO does not run on NVIDIA GPUs, so a load on a CUDA
device fails naming the model (its instance groups must be ``KIND_CPU``).

The model is read and compiled once per model, for the ``CPU`` device, and shared by its
instances; each batch takes an infer request of its own from a free list (one per batch
computing at once), so the instances run side by side on the compiled model's streams.
Defaults: ``PERFORMANCE_HINT`` THROUGHPUT with ``NUM_STREAMS`` = the model's instances and
``INFERENCE_NUM_THREADS`` = the worker's threads, so the streams split the worker's cores
between them; ``INFERENCE_PRECISION_HINT`` ``f32``, so an FP32 model computes in FP32 on
every CPU (OpenVINO's own default is bf16 where the CPU has AVX512_BF16 or AMX). Any config
parameter that names a writable property of OpenVINO's CPU plugin (``NUM_STREAMS``,
``INFERENCE_NUM_THREADS``, ``PERFORMANCE_HINT``, ``INFERENCE_PRECISION_HINT`` = ``bf16`` on
a Xeon that has it, ``ENABLE_CPU_PINNING``...) is passed to it as given, as Triton's
OpenVINO backend passes them; the older backend's names (``CPU_THREADS_NUM``,
``CPU_THROUGHPUT_STREAMS``, ``ENFORCE_BF16``, ``CPU_BIND_THREAD``) are read as their present
ones.

Batching: a config with ``max_batch_size`` > 0 over an IR whose first dimensions are fixed
reshapes the model's inputs to a dynamic first dimension (OpenVINO's dynamic shapes), as
Triton does unless ``SKIP_OV_DYNAMIC_BATCHSIZE`` is ``YES``.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov

from weir.autocomplete import (
    SKIP_DYNAMIC_BATCH,
    SKIP_OV_DYNAMIC_BATCH,
    skips_dynamic_batch,
)
from weir.config import ModelConfig
from weir.errors import ConfigError
from workers.backends.base import RuntimeBackend

logger = logging.getLogger(__name__)

DEVICE = "CPU"
# The parameter names of Triton's first OpenVINO backend, still in older repositories.
LEGACY_PARAMETERS: dict[str, Callable[[str], tuple[str, str]]] = {
    "CPU_THREADS_NUM": lambda v: ("INFERENCE_NUM_THREADS", v),
    "CPU_THROUGHPUT_STREAMS": lambda v: (
        ("PERFORMANCE_HINT", "THROUGHPUT") if v.lower() == "auto" else ("NUM_STREAMS", v)
    ),
    "ENFORCE_BF16": lambda v: ("INFERENCE_PRECISION_HINT", "bf16" if v == "YES" else "f32"),
    "CPU_BIND_THREAD": lambda v: ("ENABLE_CPU_PINNING", "NO" if v == "NO" else "YES"),
}


class OpenVinoBackend(RuntimeBackend):
    """An IR compiled once for the CPU, shared by the model's instances."""

    runtime = "OpenVINO"

    def load(self) -> None:
        config = self.config
        if self.device is not None:
            raise ConfigError(
                f"model {config.name}: Weir runs OpenVINO on the CPU only (OpenVINO does not "
                f"run on NVIDIA GPUs), not on CUDA device {self.device}; give the model's "
                "instance_group kind KIND_CPU"
            )
        core = ov.Core()
        model = core.read_model(str(self.path))
        _dynamic_batch(config, model)
        properties = compile_properties(core, config, self.share.total, self.instances)
        self.compiled = core.compile_model(model, DEVICE, properties)
        self.outputs = _output_ports(config, self.path, self.compiled)
        _check_inputs(config, self.path, self.compiled)
        self.requests: queue.SimpleQueue[ov.InferRequest] = queue.SimpleQueue()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            request = self.requests.get_nowait()
        except queue.Empty:
            request = self.compiled.create_infer_request()
        try:
            with self.share.computing():  # counted, so torch models beside it take fewer
                results = request.infer(inputs, share_outputs=False)
            return {name: np.asarray(results[port]) for name, port in self.outputs.items()}
        finally:
            self.requests.put(request)


def compile_properties(
    core: ov.Core, config: ModelConfig, threads: int, instances: int
) -> dict[str, Any]:
    """What the CPU plugin compiles with: Weir's defaults, then the config's parameters."""
    properties: dict[str, Any] = {
        "PERFORMANCE_HINT": "THROUGHPUT",
        "NUM_STREAMS": str(max(instances, 1)),
        "INFERENCE_NUM_THREADS": str(max(threads, 1)),
        # The model's own precision unless the config says otherwise: on a CPU with
        # AVX512_BF16 or AMX the plugin would otherwise compute FP32 models in bf16.
        "INFERENCE_PRECISION_HINT": "f32",
    }
    supported = core.get_property(DEVICE, "SUPPORTED_PROPERTIES")
    for given, given_value in config.parameters.items():
        legacy = LEGACY_PARAMETERS.get(given)
        key, value = legacy(given_value) if legacy else (given, given_value)
        if supported.get(key) == "RW":
            properties[key] = value
        elif key not in (SKIP_OV_DYNAMIC_BATCH, SKIP_DYNAMIC_BATCH) and key.isupper():
            logger.warning(
                "model %s: parameter %s is not a property of OpenVINO's CPU plugin; ignored",
                config.name,
                key,
            )
    return properties


def _dynamic_batch(config: ModelConfig, model: ov.Model) -> None:
    if config.max_batch_size <= 0 or skips_dynamic_batch(config.parameters):
        return
    shapes: dict[Any, ov.PartialShape] = {}
    for port in model.inputs:
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic or shape.rank.get_length() == 0 or shape[0].is_dynamic:
            continue
        dims = [ov.Dimension(-1), *(shape[i] for i in range(1, shape.rank.get_length()))]
        shapes[port] = ov.PartialShape(dims)
    if shapes:
        model.reshape(shapes)


def _output_ports(config: ModelConfig, path: Path, compiled: ov.CompiledModel) -> dict[str, Any]:
    """Each config output's port of the compiled model, by tensor name."""
    ports: dict[str, Any] = {}
    for port in compiled.outputs:
        for name in port.get_names():
            ports.setdefault(name, port)
    missing = [spec.name for spec in config.output if spec.name not in ports]
    if missing:
        raise ConfigError(
            f"{path}: the compiled model has no output {missing[0]!r} "
            f"(outputs: {', '.join(sorted(ports))})"
        )
    return {spec.name: ports[spec.name] for spec in config.output}


def _check_inputs(config: ModelConfig, path: Path, compiled: ov.CompiledModel) -> None:
    names = {name for port in compiled.inputs for name in port.get_names()}
    for spec in config.input:
        if spec.name not in names:
            raise ConfigError(
                f"{path}: the compiled model has no input {spec.name!r} "
                f"(inputs: {', '.join(sorted(names))})"
            )
