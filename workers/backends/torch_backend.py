"""PyTorch backend: TorchScript (``model.pt``) and ``torch.export`` programs (``model.pt2``).

Neither format is loaded by unpickling arbitrary objects. Inputs bind to ``forward()``
arguments by name when every config input names one, else in config order. Outputs map to
config outputs by name when the model returns a dict, else in order.

Each forward pass runs on its own number of intra-op threads: the config parameter
``INTRA_OP_THREAD_COUNT`` (Triton's name) when set, else its share of the worker's torch
threads among the batches computing when it starts (:mod:`workers.threads`): all of them
alone, half each when two instances are busy. The count is per calling thread (OpenMP's
own), set before each call where it differs. The instances of a model share one loaded
module, so its weights are in memory once.

On a CUDA device (the gpu pool) the module is loaded onto that device once, and each
instance on it is a :class:`DeviceInstance`: the shared module, and a CUDA stream and pinned
staging buffers of its own (:mod:`workers.cuda_staging`), so the weights are in memory once
per device and the instances' batches overlap.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from weir.config import ModelConfig
from weir.errors import ConfigError, ServerError
from workers.backends.base import ModelBackend
from workers.threads import ThreadShare

logger = logging.getLogger(__name__)

TORCHSCRIPT_FILE = "model.pt"
EXPORT_FILE = "model.pt2"
INTRA_OP_THREADS = "INTRA_OP_THREAD_COUNT"


class TorchBackend(ModelBackend):
    """A PyTorch model on the CPU, shared by its instances (forward passes are reentrant)."""

    shareable = True

    def __init__(
        self,
        config: ModelConfig,
        version_dir: Path,
        share: ThreadShare | None = None,
        device: int | None = None,
    ) -> None:
        self.config = config
        self.device = device
        self.threads = intra_op_threads(config)  # 0: a share of the worker's
        self.share = share or ThreadShare()
        # On the loading thread: torch's default, or the worker's WEIR_WORKER_TORCH_THREADS.
        self.share.know(torch.get_num_threads())
        location = torch.device("cpu") if device is None else torch.device("cuda", device)
        self.module, arg_names = _load(version_dir, config.default_model_filename, location)
        self.input_order = _bind_inputs(config, arg_names)
        self.output_names = [spec.name for spec in config.output]

    def instance(self) -> ModelBackend:
        return self if self.device is None else DeviceInstance(self)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.device is not None:  # the loaded object is not an instance: each has a stream
            raise ServerError(f"model {self.config.name}: run it through instance()")
        with self.share.computing() as share, torch.inference_mode():
            threads = self.threads or share
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            args = [torch.from_numpy(inputs[name]) for name in self.input_order]
            result = self.module(*args)
            named = self.name_outputs(result)
        return {name: _to_numpy(tensor) for name, tensor in named.items()}

    def name_outputs(self, result: Any) -> dict[str, torch.Tensor]:
        """The module's result as the config's outputs, by name."""
        if isinstance(result, dict):
            missing = [name for name in self.output_names if name not in result]
            if missing:
                raise ServerError(f"model returned no output named {', '.join(missing)}")
            values = [result[name] for name in self.output_names]
        else:
            values = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(values) != len(self.output_names):
            raise ServerError(
                f"model returned {len(values)} outputs, config declares {len(self.output_names)}"
            )
        for value in values:
            if not isinstance(value, torch.Tensor):
                raise ServerError(f"model returned {type(value).__name__}, expected a tensor")
        return dict(zip(self.output_names, values, strict=True))


class DeviceInstance(ModelBackend):
    """One instance of a model loaded on a CUDA device: its module, its own CUDA stream."""

    def __init__(self, loaded: TorchBackend) -> None:
        from workers.cuda_staging import CudaStaging

        device = loaded.device
        if device is None:
            raise ServerError(f"model {loaded.config.name}: not loaded on a CUDA device")
        self.loaded = loaded
        self.device = device
        self.staging = CudaStaging(device)

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        loaded, staging = self.loaded, self.staging
        with torch.inference_mode(), staging.running():
            args = [staging.to_device(name, inputs[name]) for name in loaded.input_order]
            named = loaded.name_outputs(loaded.module(*args))
            return staging.to_host(named)


def intra_op_threads(config: ModelConfig) -> int:
    """The config's fixed thread count per forward pass; 0 where it sets none."""
    raw = config.parameters.get(INTRA_OP_THREADS)
    if raw is None:
        return 0
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ConfigError(
            f"model {config.name}: parameter {INTRA_OP_THREADS} must be a whole number of "
            f"threads, at least 1; got {raw!r}"
        )
    return threads


def _to_numpy(value: torch.Tensor) -> np.ndarray:
    return value.detach().cpu().contiguous().numpy()


def _load(
    version_dir: Path, filename: str, location: torch.device
) -> tuple[Callable[..., Any], list[str]]:
    if filename:  # default_model_filename: a .pt2 file is a torch.export program
        path = version_dir / filename
        if not path.is_file():
            raise ConfigError(f"{version_dir}: no {filename} (default_model_filename)")
        load = _load_export if path.suffix == ".pt2" else _load_script
        return load(path, location)
    scripted = version_dir / TORCHSCRIPT_FILE
    exported = version_dir / EXPORT_FILE
    if scripted.is_file():
        return _load_script(scripted, location)
    if exported.is_file():
        return _load_export(exported, location)
    raise ConfigError(f"{version_dir}: no {TORCHSCRIPT_FILE} or {EXPORT_FILE}")


def _load_script(path: Path, location: torch.device) -> tuple[Callable[..., Any], list[str]]:
    module = torch.jit.load(str(path), map_location=location)  # type: ignore[no-untyped-call]
    module.eval()
    return module, [arg.name for arg in module.forward.schema.arguments[1:]]


def _load_export(path: Path, location: torch.device) -> tuple[Callable[..., Any], list[str]]:
    module = torch.export.load(str(path)).module()
    if location.type != "cpu":
        module = module.to(location)
    return module, _arg_names(module)


def _arg_names(module: Any) -> list[str]:
    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return []


def _bind_inputs(config: ModelConfig, arg_names: list[str]) -> list[str]:
    config_names = [spec.name for spec in config.input]
    if sorted(config_names) == sorted(arg_names):
        return arg_names
    if arg_names and len(arg_names) != len(config_names):
        raise ConfigError(
            f"model {config.name}: forward() takes {len(arg_names)} inputs "
            f"({', '.join(arg_names)}), config declares {len(config_names)}"
        )
    return config_names
