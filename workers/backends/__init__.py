"""Backends by Triton's names. Each is imported only when a model needs it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weir.config import Backend, ModelConfig
from weir.errors import ConfigError
from workers.backends.base import ModelBackend
from workers.threads import ThreadShare


@dataclass(frozen=True)
class ArchiveOptions:
    """How the worker loads TorchServe archives (its ``ts_*`` settings).

    ``install_requirements``: install an archive's ``requirements.txt``
    (``install_py_dep_per_model``); ``decode_input_request``: give handlers JSON and text
    inputs decoded, unless a handler chooses otherwise as it loads.
    """

    install_requirements: bool = False
    decode_input_request: bool = True


def load_backend(
    config: ModelConfig,
    version_dir: Path,
    share: ThreadShare | None = None,
    instances: int = 1,
    archives: ArchiveOptions | None = None,
    device: int | None = None,
) -> ModelBackend:
    """Load ``config``'s model from ``version_dir``, on the CPU or a CUDA device.

    ``share``: the worker's threads, which the instances of every model share out;
    ``instances``: how many instances of this model the worker runs (on ``device``);
    ``archives``: how a TorchServe archive loads (default :class:`ArchiveOptions`);
    ``device``: the index of the CUDA device to load it on (None: the CPU). Each instance
    calls :meth:`ModelBackend.instance` of what this returns (a ``shareable`` one: of one
    loaded object per device).
    """
    if config.backend is Backend.PYTORCH:
        from workers.backends.torch_backend import TorchBackend

        return TorchBackend(config, version_dir, share, device)
    if config.backend is Backend.ONNXRUNTIME:
        from workers.backends.onnxruntime_backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend(config, version_dir, share, instances, device)
    if config.backend is Backend.OPENVINO:
        from workers.backends.openvino_backend import OpenVinoBackend

        return OpenVinoBackend(config, version_dir, share, instances, device)
    if config.backend is Backend.TENSORRT:
        return _tensorrt(config, version_dir, instances, device)
    if config.backend is Backend.PYTHON:
        from workers.backends.python_backend import load_python

        return load_python(config, version_dir, device)
    if config.backend is Backend.TORCHSERVE:
        from workers.backends.torchserve_backend import TorchServeBackend

        return TorchServeBackend(config, version_dir, archives or ArchiveOptions(), device)
    raise ConfigError(
        f"{version_dir}: backend {config.backend.value!r} is not available in this worker yet"
    )


def _tensorrt(
    config: ModelConfig, version_dir: Path, instances: int, device: int | None
) -> ModelBackend:
    if device is None:
        raise ConfigError(f"model '{config.name}': a TensorRT engine runs on a CUDA device only")
    from workers.backends.tensorrt_backend import TensorRTBackend

    return TensorRTBackend(config, version_dir, device, instances)
