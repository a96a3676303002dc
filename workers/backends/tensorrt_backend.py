"""TensorRT backend: ``model.plan`` (Triton's ``tensorrt`` / ``tensorrt_plan``), on CUDA devices.

The engine is deserialized once per device and shared by the model's instances there; each
instance has an execution context of its own (its activation memory and input shapes) and a
:class:`~workers.cuda_staging.CudaStaging` (a CUDA stream, pinned host buffers). At load the
engine is checked against the config: the same inputs and outputs, the same datatypes, the
non-batch dims alike (-1 on either side matches anything), for a batching model a batch dim
that is dynamic (or 1 when ``max_batch_size`` is 1), and a ``max_batch_size`` no larger than
the largest batch an optimisation profile admits. A disagreement is a ConfigError naming the
file, the tensor and both values.

Optimisation profiles: instance k prefers profile k % profiles, so the instances on a device
start on distinct profiles; a batch its profile does not admit runs on the admitting profile
whose opt shapes are nearest. TensorRT's ``IExecutionContext`` (NvInferRuntime.h, TensorRT 7
to 10) says that when an engine has dynamic shapes, execution contexts in concurrent use must
use separate optimisation profiles. So a batch holds its profile's lock, shared by the
contexts of the engine, from selecting the profile until its outputs are on the host: two
instances on one profile take turns, instances on distinct profiles overlap.

A batch: inputs through pinned buffers to the device on the instance's stream, the engine
enqueued on that stream (``execute_async_v3``), outputs back with one wait on that stream. An
output whose shape depends on the data (-1 once the input shapes are set) is refused at run
time. BF16 cannot cross Weir's numpy tensors and is refused at load.

tensorrt and torch are imported when a model is loaded: importing this module needs neither.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from weir import datatypes
from weir.autocomplete import model_path
from weir.config import ModelConfig
from weir.errors import ConfigError, InvalidInput, ServerError
from workers.backends.base import ModelBackend
from workers.backends.tensorrt_engine import (
    ProfileRanges,
    check_io,
    choose_profile,
    describe,
    quoted_names,
    shape_of,
)
from workers.cuda_staging import CudaStaging
from workers.placement import check_backend_module

logger = logging.getLogger(__name__)

# Triton's datatypes -> the torch dtype (by name) an output's device buffer has.
TORCH_DTYPES: dict[str, str] = {
    "FP32": "float32",
    "FP16": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
}
# TensorRT's log severities -> logging levels; VERBOSE messages are dropped.
LOG_LEVELS: dict[str, int] = {
    "INTERNAL_ERROR": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARNING": logging.WARNING,
    "INFO": logging.DEBUG,
}


class TensorRTBackend(ModelBackend):
    """A TensorRT engine on one CUDA device, deserialized once and shared by its instances.

    ``instances``: how many instances of the model the worker runs on ``device``. The loaded
    object runs batches too, on an instance of its own made when its first batch comes.
    """

    shareable = True
    device: int

    def __init__(
        self, config: ModelConfig, version_dir: Path, device: int, instances: int = 1
    ) -> None:
        self.config = config
        self.device = device
        self.path = model_path(config, version_dir)
        self.instances = max(instances, 1)
        self.trt, self.torch = _modules(config)
        self.engine = self._deserialize()
        self.io = describe(self.engine)
        self._check()
        self.ranges: list[ProfileRanges] = [
            {info.name: info.ranges[p] for info in self.io if info.is_input}
            for p in range(self.engine.num_optimization_profiles)
        ]
        # One lock per profile, held while a batch runs on it: see the module's docstring.
        self.profile_locks = [threading.Lock() for _ in self.ranges]
        self._made = 0  # instances made, so the next prefers the next profile
        self._making = threading.Lock()
        self._own: TensorRTInstance | None = None
        logger.info(
            "model %s: TensorRT engine on cuda:%d, %d optimisation profiles, %d instances",
            config.name,
            device,
            len(self.ranges),
            self.instances,
        )

    def _deserialize(self) -> Any:
        try:
            plan = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the engine: {exc}") from None
        trt = self.trt
        with self.torch.cuda.device(self.device):
            # TensorRT's Python API wants the runtime to outlive the engines it makes.
            self.runtime = trt.Runtime(tensorrt_logger(trt))
            try:
                engine = self.runtime.deserialize_cuda_engine(plan)
            except Exception as exc:  # the binding raises its own types
                raise ConfigError(f"{self.path}: TensorRT cannot deserialize it: {exc}") from None
        if engine is None:
            raise ConfigError(
                f"{self.path}: TensorRT {trt.__version__} cannot deserialize it: not a TensorRT "
                "plan, or one built by another TensorRT version or for another GPU (TensorRT's "
                "reason is in the log)"
            )
        return engine

    def _check(self) -> None:
        try:
            check_io(self.config, self.io)
        except ConfigError as exc:
            raise ConfigError(f"{self.path}: {exc}") from None
        for spec in (*self.config.input, *self.config.output):
            if spec.datatype == datatypes.BF16:
                raise ConfigError(
                    f"{self.path}: tensor '{spec.name}' is BF16, which Weir's numpy tensors "
                    "cannot carry"
                )

    def instance(self) -> TensorRTInstance:
        with self._making:
            index = self._made
            self._made += 1
        return TensorRTInstance(self, index)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._own is None:  # one call at a time on the loaded object: no race here
            self._own = self.instance()
        return self._own.infer(inputs)


class TensorRTInstance(ModelBackend):
    """One instance of a TensorRT model: an execution context, a CUDA stream, pinned buffers.

    The engine, its profile locks and its load checks are the backend's. ``index``: the
    instance's place among the backend's, which picks the profile it prefers.
    """

    shareable = True
    device: int

    def __init__(self, backend: TensorRTBackend, index: int) -> None:
        self.backend = backend
        self.config = backend.config
        self.device = backend.device
        self.preferred = index % len(backend.ranges)
        torch = backend.torch
        with torch.cuda.device(backend.device):
            self.context = backend.engine.create_execution_context()
            self.staging = CudaStaging(backend.device)
        if self.context is None:
            raise ServerError(
                f"model '{self.config.name}': TensorRT cannot make an execution context on "
                f"cuda:{backend.device} (out of device memory?)"
            )
        self.profile: int | None = None  # the context's, once this instance has set one
        self.inputs = {info.name: info for info in backend.io if info.is_input}
        self.outputs = {
            info.name: getattr(torch, TORCH_DTYPES[info.datatype])
            for info in backend.io
            if not info.is_input
        }

    def instance(self) -> TensorRTInstance:
        return self.backend.instance()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._check_inputs(inputs)
        shapes = {name: tuple(int(d) for d in array.shape) for name, array in inputs.items()}
        profile = choose_profile(self.backend.ranges, shapes, self.preferred)
        with self.backend.profile_locks[profile], self.staging.running():
            try:
                return self._run(profile, inputs)
            except BaseException:
                # Nothing of a failed batch may run on past the profile's lock, nor read a
                # pinned buffer the next batch writes.
                self.staging.stream.synchronize()
                raise

    def _run(self, profile: int, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One batch on ``profile``; the device inputs live until the stream is done."""
        self._use_profile(profile)
        staged = self._bind_inputs(inputs)
        outputs = self._bind_outputs()
        self._enqueue()
        results = self.staging.to_host(outputs)
        del staged
        return results

    def _check_inputs(self, inputs: dict[str, np.ndarray]) -> None:
        model = self.config.name
        missing = [name for name in self.inputs if name not in inputs]
        if missing:
            raise InvalidInput(f"model '{model}': the engine needs input {quoted_names(missing)}")
        for name, array in inputs.items():
            info = self.inputs.get(name)
            if info is None:
                raise InvalidInput(f"model '{model}' has no input '{name}'")
            if array.dtype != datatypes.numpy_dtype(info.datatype):
                raise InvalidInput(
                    f"model '{model}': input '{name}' is {array.dtype}, the engine takes "
                    f"{info.datatype}"
                )

    def _use_profile(self, profile: int) -> None:
        """Switch the context to ``profile``, on the instance's stream, where it differs."""
        if profile == self.profile:
            return
        self.profile = None  # unknown until the switch succeeds
        try:
            switched = self.context.set_optimization_profile_async(
                profile, self.staging.stream.cuda_stream
            )
        except RuntimeError as exc:  # the binding raises where the C++ API returns false
            raise ServerError(f"{self._where()}: cannot select profile {profile}: {exc}") from None
        if not switched:
            raise ServerError(f"{self._where()}: cannot select profile {profile}")
        self.profile = profile

    def _bind_inputs(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        staged = {}
        for name, array in inputs.items():
            if not self.context.set_input_shape(name, tuple(array.shape)):
                raise InvalidInput(
                    f"{self._where()}: input '{name}' shape {list(array.shape)} is refused by "
                    f"profile {self.profile}"
                )
            tensor = self.staging.to_device(name, array)
            self.context.set_tensor_address(name, tensor.data_ptr())
            staged[name] = tensor
        return staged

    def _bind_outputs(self) -> dict[str, Any]:
        torch = self.backend.torch
        outputs = {}
        for name, dtype in self.outputs.items():
            shape = shape_of(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise ServerError(
                    f"{self._where()}: output '{name}' has shape {list(shape)} once the input "
                    "shapes are set: data-dependent output shapes are not supported"
                )
            tensor = torch.empty(shape, dtype=dtype, device=self.staging.device)
            self.context.set_tensor_address(name, tensor.data_ptr())
            outputs[name] = tensor
        return outputs

    def _enqueue(self) -> None:
        if not self.context.execute_async_v3(self.staging.stream.cuda_stream):
            raise ServerError(
                f"{self._where()}: TensorRT could not run the batch (execute_async_v3 failed; "
                "its reason is in the log)"
            )

    def _where(self) -> str:
        return f"model '{self.config.name}' on cuda:{self.device}"


def _modules(config: ModelConfig) -> tuple[Any, Any]:
    """The tensorrt and torch modules; ConfigError, naming the model, without tensorrt."""
    check_backend_module(config)
    trt = importlib.import_module("tensorrt")
    torch = importlib.import_module("torch")
    return trt, torch


@functools.cache
def tensorrt_logger(trt: Any) -> Any:
    """The process's TensorRT logger, which passes TensorRT's messages to this module's.

    One for the process, kept alive with it (TensorRT's objects log through the logger they
    were made with), and the same for every runtime: TensorRT warns when a runtime brings a
    logger other than the one an earlier runtime brought.
    """

    class Forward(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            level = LOG_LEVELS.get(getattr(severity, "name", str(severity)))
            if level is not None:
                logger.log(level, "TensorRT: %s", msg)

    return Forward()
