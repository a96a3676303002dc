"""Python backend: a model written as a TorchServe-shaped handler in ``<version>/model.py``.

The handler contract:

- ``model.py`` defines the handler class. It is the class that the module-level name
  ``handler`` is bound to, if there is one; otherwise the one class *defined* in
  ``model.py`` (not imported into it) that has ``initialize`` and ``inference`` methods.
  None or several such classes is a load error naming the file.
- The class is built with no arguments, once per instance the ``instance_group`` asks
  for, and ``initialize(context)`` is called once with a :class:`HandlerContext`: the model
  name and version, the version directory (``model_dir``, where files such as a
  ``tokenizer.json`` live), the :class:`~weir.config.ModelConfig` and its ``parameters``, and
  where the instance runs, by Triton's names: ``model_instance_kind`` ``"CPU"`` or ``"GPU"``
  and ``model_instance_device_id``, the CUDA device's index among those the worker sees, as a
  string (``"0"`` on the CPU, as Triton gives it); ``system_properties["gpu_id"]`` is that
  index too (None on the CPU), TorchServe's name. A handler on a GPU puts its model there.
- Each batch runs ``preprocess(batch)`` -> ``inference(data)`` -> ``postprocess(data)``.
  ``batch`` maps every config input name to a numpy array holding the whole batch (the
  first dimension is the batch when ``max_batch_size > 0``); ``BYTES`` inputs arrive as
  object arrays of ``bytes``. What ``preprocess`` returns goes to ``inference``, and what
  that returns to ``postprocess``; ``preprocess`` and ``postprocess`` are optional (the
  identity when missing).
- ``postprocess`` (or ``inference`` without it) returns a mapping from output name to
  an array-like with one row per input row. Every config output must be present.
  Numeric outputs are cast to the config datatype when numpy calls the cast safe or
  same-kind (``float64`` to ``FP32``, not ``float`` to ``INT64``); ``BYTES`` outputs may
  hold ``bytes`` or ``str``.
- While a batch runs, ``context.is_cancelled()`` tells whether anyone still waits for it
  (each request past its deadline or its client gone) and ``context.time_left_s()`` how
  long the last of them will: a handler that loops over a long input checks between steps
  and raises :class:`~weir.errors.DeadlineExceeded` to stop.
- A decoupled model (``model_transaction_policy { decoupled: true }``) may send a request
  responses before its last while the batch runs: ``context.send_part(row, outputs)``
  sends the request holding batch row ``row`` its rows of ``outputs`` at once (Triton's
  response sender; :mod:`workers.parts`). What ``postprocess`` returns is each request's
  last response.
- A :class:`~weir.errors.WeirError` raised by the handler keeps its meaning (raise
  ``InvalidInput`` for a bad input: the client gets a 400); any other exception becomes a
  :class:`~weir.errors.ServerError` naming the model and the stage that failed. The worker
  runs a failed batch again in halves (:mod:`workers.execution`), so the requests it still
  fails on get that error.

Calls come from one executor thread per instance, one batch at a time.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from weir import datatypes
from weir.autocomplete import model_path
from weir.config import ModelConfig
from weir.errors import ConfigError, ServerError, WeirError
from workers import batch_wait
from workers.backends.base import ModelBackend

logger = logging.getLogger(__name__)


REQUIRED_METHODS = ("initialize", "inference")
# Every load of a model.py gets a module name of its own: instances share no module state.
_LOADS = itertools.count()


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What ``initialize(context)`` receives."""

    model_name: str
    model_version: str
    model_dir: Path
    config: ModelConfig
    parameters: Mapping[str, str] = field(default_factory=dict)
    device: int | None = None  # the CUDA device's index; None: the CPU

    @property
    def model_instance_kind(self) -> str:
        """Triton's name for where the instance runs: ``"GPU"`` or ``"CPU"``."""
        return "CPU" if self.device is None else "GPU"

    @property
    def model_instance_device_id(self) -> str:
        """Triton's name for the CUDA device's index, a string; ``"0"`` on the CPU."""
        return str(self.device or 0)

    @property
    def system_properties(self) -> dict[str, Any]:
        """TorchServe's names for where the model's files are and its GPU (None: the CPU)."""
        return {"model_dir": str(self.model_dir), "gpu_id": self.device}

    def is_cancelled(self) -> bool:
        """Whether nobody waits for the batch being run any more (Triton's name).

        True once each of its requests is past its deadline or its client left: a handler
        that loops over a long input may check it and stop, raising ``DeadlineExceeded``.
        """
        return batch_wait.is_cancelled()

    def time_left_s(self) -> float:
        """Seconds until the last deadline of the batch being run (inf outside a batch)."""
        return batch_wait.time_left_s()

    def send_part(self, row: int, outputs: Mapping[str, Any]) -> None:
        """Send the request holding batch row ``row`` a response now, while the batch runs.

        For a decoupled model (``model_transaction_policy { decoupled: true }``), as Triton's
        response sender: ``outputs`` maps output names to that request's rows of each (any
        of the config's outputs). What ``postprocess`` returns is each request's last
        response. The request's client gets each as it is sent (gRPC ``ModelStreamInfer``).
        """
        if not self.config.decoupled:
            raise ServerError(
                f"model '{self.model_name}' sent a part but is not decoupled: set "
                "model_transaction_policy { decoupled: true } in its config"
            )
        arrays = {}
        for name, value in outputs.items():
            spec = self.config.output_spec(name)
            if spec is None:
                raise ServerError(f"model '{self.model_name}' has no output {name}")
            arrays[name] = output_array(self.model_name, name, spec.datatype, value)
        if not batch_wait.send_part(row, arrays):
            raise ServerError(f"model '{self.model_name}' sent a part outside a batch")


class PythonBackend(ModelBackend):
    """One instance of a Python handler, on the CPU or CUDA device ``device``."""

    def __init__(
        self,
        config: ModelConfig,
        version_dir: Path,
        device: int | None = None,
        module: ModuleType | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.path = model_path(config, version_dir)
        if module is None:
            module = load_module(config.name, version_dir, self.path)
        handler_class = find_handler_class(module, self.path)
        context = HandlerContext(
            config.name, version_dir.name, version_dir, config, dict(config.parameters), device
        )
        try:
            self.handler = handler_class()
            self.handler.initialize(context)
        except Exception as exc:
            raise ConfigError(
                f"{self.path}: {handler_class.__name__}.initialize failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        data: Any = self._stage("preprocess", inputs)
        data = self._stage("inference", data)
        data = self._stage("postprocess", data)
        return self._outputs(data)

    def _stage(self, name: str, data: Any) -> Any:
        method: Callable[[Any], Any] | None = getattr(self.handler, name, None)
        if method is None:
            return data
        try:
            return method(data)
        except WeirError:
            raise
        except Exception as exc:
            logger.exception("python model %s: %s failed", self.config.name, name)
            raise ServerError(
                f"model '{self.config.name}' failed in {name}: {type(exc).__name__}: {exc}"
            ) from exc

    def _outputs(self, data: Any) -> dict[str, np.ndarray]:
        if not isinstance(data, Mapping):
            raise ServerError(
                f"model '{self.config.name}' returned {type(data).__name__}; "
                "postprocess must return a mapping of output name to array"
            )
        missing = [spec.name for spec in self.config.output if spec.name not in data]
        if missing:
            raise ServerError(f"model '{self.config.name}' returned no output {', '.join(missing)}")
        return {
            spec.name: output_array(self.config.name, spec.name, spec.datatype, data[spec.name])
            for spec in self.config.output
        }


def output_array(model: str, name: str, datatype: str, value: Any) -> np.ndarray:
    """A handler's output as an array of the config's datatype, cast when that is safe."""
    array = np.asarray(value)
    if datatype == datatypes.BYTES:
        return array if array.dtype == object else array.astype(object)
    dtype = datatypes.NUMPY_DTYPES.get(datatype)
    if dtype is None or array.dtype == dtype:
        return array
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise ServerError(
            f"model '{model}' returned {name} as {array.dtype}, config says {datatype}"
        )
    return array.astype(dtype)


def load_python(config: ModelConfig, version_dir: Path, device: int | None) -> ModelBackend:
    """The model ``model.py`` defines: Triton's (``TritonPythonModel``) or Weir's handler.

    A Triton Python model is :mod:`workers.backends.triton_python`'s.
    """
    from workers.backends import pb_utils
    from workers.backends.triton_python import MODULE_NAME, TritonPythonBackend

    sys.modules.setdefault(MODULE_NAME, pb_utils)
    module = load_module(config.name, version_dir, model_path(config, version_dir))
    if hasattr(module, "TritonPythonModel"):
        return TritonPythonBackend(config, version_dir, module, device)
    return PythonBackend(config, version_dir, device, module)


def load_module(model_name: str, version_dir: Path, path: Path) -> ModuleType:
    """Import ``model.py`` by path, under a module name of its own for every load."""
    if not path.is_file():
        raise ConfigError(f"{version_dir}: no {path.name}")
    safe_name = re.sub(r"\W", "_", model_name)
    module_name = f"weir_python_model_{safe_name}_v{version_dir.name}_{next(_LOADS)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it, as an import would be, so dataclasses and pickle work.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ConfigError(f"{path}: import failed: {type(exc).__name__}: {exc}") from exc
    return module


def find_handler_class(module: ModuleType, path: Path) -> type[Any]:
    """The handler class of a ``model.py`` module, by the rule in the module docstring."""
    chosen = getattr(module, "handler", None)
    if chosen is not None:
        if not inspect.isclass(chosen) or not _is_handler(chosen):
            raise ConfigError(
                f"{path}: handler must be a class with {' and '.join(REQUIRED_METHODS)}"
            )
        return chosen
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and _is_handler(cls)
    ]
    if len(found) != 1:
        names = ", ".join(cls.__name__ for cls in found) or "none"
        raise ConfigError(
            f"{path}: expected one class with {' and '.join(REQUIRED_METHODS)} methods "
            f"(found {names}); or set handler = <the class>"
        )
    return found[0]


def _is_handler(cls: type[Any]) -> bool:
    return all(callable(getattr(cls, method, None)) for method in REQUIRED_METHODS)
