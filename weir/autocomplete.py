"""Configs filled from the model and checked against it, by Triton's auto-complete rules.

For a backend whose files carry a signature (ONNX Runtime, OpenVINO), a config that lacks
``input`` or ``output`` (or a model with no config file at all) is completed from the model
file of its latest served version, as Triton's backends do (a Triton Python model completes
its own config: :mod:`weir.python_autocomplete`):

- the model can batch when every input and output has a dynamic first dimension; then a
  ``max_batch_size`` left at 0 becomes the default (Triton's ``default-max-batch-size``, 4;
  ``WEIR_DEFAULT_MAX_BATCH_SIZE``), and with more than 1, a config with no
  ``dynamic_batching`` gets Triton's default one. A model that cannot batch with a
  ``max_batch_size`` above 0 is an error;
- the inputs or outputs the config lacks are the model's, names, datatypes and dims (the
  batch dimension dropped when the model batches).

Then every served version's model is checked against the config, completed or given: each
config tensor must exist in the model with the same datatype and a compatible shape, and
every model input must be in the config. A disagreement stops start-up naming the model
file, the tensor and both values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from weir import datatypes
from weir.completion import Completion
from weir.config import (
    BACKEND_ALIASES,
    Backend,
    ModelConfig,
    TensorSpec,
    VersionPolicy,
)
from weir.config_parameters import flatten_parameters
from weir.config_ragged import unbatched_ranks
from weir.errors import ConfigError
from weir.onnx_file import read_onnx_signature
from weir.openvino_file import read_openvino_signature
from weir.python_autocomplete import complete_python, defines_hook
from weir.signature import ModelSignature, TensorSignature
from weir.torchserve import envelope

SKIP_OV_DYNAMIC_BATCH = "SKIP_OV_DYNAMIC_BATCHSIZE"
SKIP_DYNAMIC_BATCH = "SKIP_DYNAMIC_BATCHSIZE"  # the name in Triton's first OpenVINO backend
# Each backend's model file in a version directory, unless default_model_filename says.
DEFAULT_FILENAMES: dict[Backend, str] = {
    Backend.PYTORCH: "model.pt",
    Backend.ONNXRUNTIME: "model.onnx",
    Backend.OPENVINO: "model.xml",
    Backend.TENSORRT: "model.plan",
    Backend.PYTHON: "model.py",
    Backend.TORCHSERVE: "model.mar",
}
READERS: dict[Backend, Callable[[Path], ModelSignature]] = {
    Backend.ONNXRUNTIME: read_onnx_signature,
    Backend.OPENVINO: read_openvino_signature,
}


def model_path(config: ModelConfig, version_dir: Path) -> Path:
    """The model file of ``config`` in one version directory."""
    return version_dir / (config.default_model_filename or DEFAULT_FILENAMES[config.backend])


def guess_backend(model_dir: Path, versions: list[int]) -> str | None:
    """For a model with no config: the backend whose model file its newest version holds.

    A Triton Python model that completes its own config needs no config file either.
    """
    for version in sorted(versions, reverse=True):
        for backend, filename in DEFAULT_FILENAMES.items():
            if backend in READERS and (model_dir / str(version) / filename).is_file():
                return backend.value
        if defines_hook(model_dir / str(version) / DEFAULT_FILENAMES[Backend.PYTHON]):
            return Backend.PYTHON.value
    return None


def complete(
    raw: dict[str, Any], model_dir: Path, versions: list[int], completion: Completion
) -> dict[str, Any]:
    """``raw`` (a parsed config) with what it lacks filled from the model, where it can be."""
    default_max_batch_size = completion.default_max_batch_size
    backend = BACKEND_ALIASES.get(str(raw.get("backend") or raw.get("platform")))
    if backend is Backend.TORCHSERVE:
        return complete_torchserve(raw, default_max_batch_size)
    if backend is Backend.PYTHON:
        return _complete_python(raw, model_dir, versions, completion.python_timeout_s)
    reader = READERS.get(backend) if backend else None
    if reader is None or backend is None or (raw.get("input") and raw.get("output")):
        return raw
    version = _latest_served(raw, versions)
    if version is None:
        return raw  # no version to read: the loader reports it
    filename = str(raw.get("default_model_filename") or DEFAULT_FILENAMES[backend])
    parameters = raw.get("parameters")
    flat = flatten_parameters(parameters) if isinstance(parameters, dict) else {}
    batch_size = int(raw.get("max_batch_size") or 0)
    signature = _as_served(backend, batch_size, flat, reader(model_dir / str(version) / filename))
    filled = dict(raw)
    _complete_batching(filled, signature, default_max_batch_size)
    batching = int(filled.get("max_batch_size") or 0) > 0
    served = _server_filled(raw)
    for field, tensors in (("input", signature.inputs), ("output", signature.outputs)):
        if not raw.get(field):
            filled[field] = [_spec(signature, t, batching) for t in tensors if t.name not in served]
    return filled


def _server_filled(raw: dict[str, Any]) -> set[str]:
    """Batch inputs, a sequence model's control and state tensors: the server's, not a client's."""
    names: set[Any] = set()
    for batch_input in raw.get("batch_input") or []:
        if isinstance(batch_input, dict):
            names.update(batch_input.get("target_name") or [])
    sequencing = raw.get("sequence_batching")
    if isinstance(sequencing, dict):
        for control in sequencing.get("control_input") or []:
            if isinstance(control, dict):
                names.add(control.get("name"))
        for state in sequencing.get("state") or []:
            if isinstance(state, dict):
                names.update((state.get("input_name"), state.get("output_name")))
    return {name for name in names if isinstance(name, str)}


def _complete_python(
    raw: dict[str, Any], model_dir: Path, versions: list[int], timeout_s: float
) -> dict[str, Any]:
    version = _latest_served(raw, versions)
    if version is None:
        return raw
    filename = str(raw.get("default_model_filename") or DEFAULT_FILENAMES[Backend.PYTHON])
    path = model_dir / str(version) / filename
    if not defines_hook(path):
        return raw
    return complete_python(raw, model_dir.name, path, timeout_s)


def complete_torchserve(raw: dict[str, Any], default_max_batch_size: int) -> dict[str, Any]:
    """A TorchServe archive's config: its fixed signature, batching as TorchServe's.

    TorchServe's handlers take a list of requests; a config that sets no ``max_batch_size``
    gets the default, as an archive registered without ``batch_size`` batches up to 1 in
    TorchServe and Weir's work-conserving batcher never waits for a fuller batch.
    """
    filled = dict(raw)
    filled.setdefault("input", envelope.INPUTS)
    filled.setdefault("output", envelope.OUTPUTS)
    if "max_batch_size" not in filled:
        filled["max_batch_size"] = default_max_batch_size
    return filled


def _as_served(
    backend: Backend, max_batch_size: int, parameters: dict[str, str], signature: ModelSignature
) -> ModelSignature:
    """The signature the backend serves.

    OpenVINO reshapes a fixed batch dimension to a dynamic one when the config batches, as
    Triton's OpenVINO backend does.
    """
    if backend is Backend.OPENVINO and max_batch_size > 0 and not skips_dynamic_batch(parameters):
        return signature.with_dynamic_batch()
    return signature


def skips_dynamic_batch(parameters: dict[str, Any]) -> bool:
    """OpenVINO's ``SKIP_OV_DYNAMIC_BATCHSIZE`` (or its older name) is ``YES``."""
    return "YES" in (parameters.get(SKIP_OV_DYNAMIC_BATCH), parameters.get(SKIP_DYNAMIC_BATCH))


def _latest_served(raw: dict[str, Any], versions: list[int]) -> int | None:
    try:
        policy = VersionPolicy.model_validate(raw.get("version_policy") or {})
    except ValidationError:
        policy = VersionPolicy()  # the loader reports the bad policy itself
    served = policy.select(versions)
    return served[-1] if served else None


def _complete_batching(
    raw: dict[str, Any], signature: ModelSignature, default_max_batch_size: int
) -> None:
    max_batch_size = int(raw.get("max_batch_size") or 0)
    if not signature.supports_batching():
        if max_batch_size:
            raise ConfigError(
                f"{signature.path}: max_batch_size is {max_batch_size} but the model cannot "
                "batch (a batching model has a dynamic first dimension on every input and "
                "output): set max_batch_size 0"
            )
        return
    if not max_batch_size:
        raw["max_batch_size"] = max_batch_size = default_max_batch_size
    if max_batch_size > 1 and "dynamic_batching" not in raw and "sequence_batching" not in raw:
        raw["dynamic_batching"] = {}


def _spec(signature: ModelSignature, tensor: TensorSignature, batching: bool) -> dict[str, Any]:
    config_type = datatypes.PROTOCOL_TO_CONFIG.get(tensor.datatype)
    if config_type is None:
        raise ConfigError(
            f"{signature.path}: tensor {tensor.name!r} has type {tensor.datatype}, which "
            "KServe has no datatype for"
        )
    if tensor.dims is None:
        raise ConfigError(
            f"{signature.path}: tensor {tensor.name!r} has no fixed rank in the model: "
            "give its dims in the config"
        )
    dims = tensor.dims[1:] if batching else tensor.dims
    return {"name": tensor.name, "data_type": config_type, "dims": list(dims)}


def check_served(config: ModelConfig, source: Path, version_dirs: list[Path]) -> None:
    """Each version's model file agrees with ``config``; ConfigError naming both values."""
    reader = READERS.get(config.backend)
    if reader is None:
        return
    for version_dir in version_dirs:
        model = reader(model_path(config, version_dir))
        signature = _as_served(config.backend, config.max_batch_size, config.parameters, model)
        check_signature(config.run_config(), source, signature)


def check_signature(config: ModelConfig, source: Path, signature: ModelSignature) -> None:
    where = f"{signature.path} (config {source.name if source.is_file() else 'filled in'})"
    model_inputs = {t.name: t for t in signature.inputs}
    model_outputs = {t.name: t for t in signature.outputs}
    ranks = unbatched_ranks(config)
    for spec in config.input:
        _check_tensor(config, where, "input", spec, model_inputs, ranks.get(spec.name))
    scattered = {name for output in config.batch_output for name in output.target_name}
    for spec in config.output:  # a scattered one: the model's rows are elements, any rank
        _check_tensor(
            config, where, "output", spec, model_outputs, 0 if spec.name in scattered else None
        )
    given = {spec.name for spec in config.input}
    missing = [name for name in model_inputs if name not in given]
    if missing:
        raise ConfigError(
            f"{where}: the model takes input {missing[0]!r}, which the config does not "
            f"declare (config inputs: {', '.join(sorted(given))})"
        )


def _check_tensor(
    config: ModelConfig,
    where: str,
    kind: str,
    spec: TensorSpec,
    model: dict[str, TensorSignature],
    rank: int | None = None,
) -> None:
    """``rank``: a ragged input's or a batch input's, the model's whatever it batches; 0: any."""
    tensor = model.get(spec.name)
    if tensor is None:
        raise ConfigError(
            f"{where}: config {kind} {spec.name!r} is not in the model, whose {kind}s are "
            f"{', '.join(model) or 'none'}"
        )
    if tensor.datatype != spec.datatype:
        raise ConfigError(
            f"{where}: {kind} {spec.name!r}: the config says "
            f"{datatypes.PROTOCOL_TO_CONFIG[spec.datatype]}, the model has "
            f"{datatypes.PROTOCOL_TO_CONFIG.get(tensor.datatype, tensor.datatype)}"
        )
    if tensor.dims is not None and rank and len(tensor.dims) != rank:
        raise ConfigError(
            f"{where}: {kind} {spec.name!r}: the model takes rank {len(tensor.dims)}; a ragged "
            f"input or batch input of this kind comes as rank {rank}"
        )
    if tensor.dims is not None and rank is None:
        _check_dims(config, where, kind, spec, tensor.dims)


def _check_dims(
    config: ModelConfig, where: str, kind: str, spec: TensorSpec, dims: tuple[int, ...]
) -> None:
    expected = config.full_shape(spec)
    problem = ""
    if len(dims) != len(expected):
        problem = f"rank {len(expected)} in the config, rank {len(dims)} in the model"
    elif config.max_batch_size > 0 and dims[0] != -1:
        problem = f"the model's first dimension is fixed at {dims[0]}, so it cannot batch"
    elif any(_differ(kind, m, c) for m, c in zip(dims, expected, strict=True)):
        problem = "the dimensions differ"
    if problem:
        raise ConfigError(
            f"{where}: {kind} {spec.name!r}: {problem} (config shape {expected}, model shape "
            f"{list(dims)}; -1 is a dynamic dimension, a batching model's first)"
        )


def _differ(kind: str, model_dim: int, config_dim: int) -> bool:
    # A dynamic model dim takes any size. A dynamic config input over a fixed model dim
    # would let requests through that the model rejects; a dynamic config output is looser.
    if model_dim == -1:
        return False
    return model_dim != config_dim and not (kind == "output" and config_dim == -1)
