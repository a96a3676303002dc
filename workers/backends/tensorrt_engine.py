"""What a TensorRT engine holds and admits, read without a GPU: its tensors and profiles.

:func:`describe` reads an engine's I/O tensors into :class:`TensorInfo`; :func:`check_io`
checks a model's config against them (names, Triton datatypes, non-batch dims, -1 on either
side matching anything, the batch dim, ``max_batch_size`` against the profiles); and
:func:`choose_profile` picks the optimisation profile a batch's input shapes run on. All of it
is plain data in and out, so it is tested on machines without TensorRT.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from weir.config import ModelConfig, TensorSpec
from weir.errors import ConfigError, InvalidInput

# TensorRT's DataType names -> Triton's datatypes.
TRITON_DATATYPES: dict[str, str] = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "BF16": "BF16",
    "INT8": "INT8",
    "INT32": "INT32",
    "INT64": "INT64",
    "BOOL": "BOOL",
    "UINT8": "UINT8",
}
Shape = tuple[int, ...]
Range = tuple[Shape, Shape, Shape]  # an input's min, opt and max shapes under one profile
ProfileRanges = dict[str, Range]  # one profile: input name -> its range


@dataclass(frozen=True)
class TensorInfo:
    """One I/O tensor of an engine, as the config is checked against it.

    ``datatype``: Triton's name; ``shape``: the engine's, -1 where dynamic; ``ranges``: an
    input's (min, opt, max) shapes under each optimisation profile, empty for an output;
    ``shape_tensor``: TensorRT takes its values on the host (not supported).
    """

    name: str
    is_input: bool
    datatype: str
    shape: Shape
    ranges: tuple[Range, ...] = ()
    shape_tensor: bool = False


def triton_datatype(trt_dtype_name: str) -> str:
    """Triton's datatype for the name of a TensorRT ``DataType`` (``FLOAT`` -> ``FP32``).

    A type Triton has no name for (FP8, INT4...) comes back as ``TensorRT <name>``, which no
    config datatype matches, so the check against the config names it.
    """
    return TRITON_DATATYPES.get(trt_dtype_name, f"TensorRT {trt_dtype_name}")


def describe(engine: Any) -> list[TensorInfo]:
    """The I/O tensors of a deserialized TensorRT engine (``ICudaEngine``), in its order."""
    return [
        _describe_tensor(engine, engine.get_tensor_name(i)) for i in range(engine.num_io_tensors)
    ]


def _describe_tensor(engine: Any, name: str) -> TensorInfo:
    is_input = engine.get_tensor_mode(name).name == "INPUT"
    profiles = range(engine.num_optimization_profiles) if is_input else range(0)
    return TensorInfo(
        name=name,
        is_input=is_input,
        datatype=triton_datatype(engine.get_tensor_dtype(name).name),
        shape=shape_of(engine.get_tensor_shape(name)),
        ranges=tuple(_range(engine.get_tensor_profile_shape(name, p)) for p in profiles),
        shape_tensor=bool(engine.is_shape_inference_io(name)),
    )


def shape_of(dims: Any) -> Shape:
    """A TensorRT ``Dims`` as a tuple of ints."""
    return tuple(int(dims[i]) for i in range(len(dims)))


def _range(shapes: Any) -> Range:
    low, opt, high = shapes
    return shape_of(low), shape_of(opt), shape_of(high)


def check_io(config: ModelConfig, engine_io: list[TensorInfo]) -> None:
    """ConfigError unless the engine serves ``config``: tensors, datatypes, dims, batch sizes.

    The messages name the tensor and both values, not the file: the caller adds that.
    """
    _check_names(engine_io, "input", [spec.name for spec in config.input])
    _check_names(engine_io, "output", [spec.name for spec in config.output])
    by_name = {info.name: info for info in engine_io}
    for spec in (*config.input, *config.output):
        _check_tensor(config, spec, by_name[spec.name])
    _check_max_batch(config, engine_io)


def _check_names(engine_io: list[TensorInfo], kind: str, config_names: list[str]) -> None:
    engine_names = [info.name for info in engine_io if info.is_input == (kind == "input")]
    missing = [name for name in config_names if name not in engine_names]
    extra = [name for name in engine_names if name not in config_names]
    if missing:
        raise ConfigError(
            f"the engine has no {kind} {quoted_names(missing)} "
            f"(its {kind}s: {quoted_names(engine_names)})"
        )
    if extra:
        raise ConfigError(
            f"the engine's {kind} {quoted_names(extra)} is not in the config "
            f"(the config's {kind}s: {quoted_names(config_names)})"
        )


def quoted_names(names: list[str]) -> str:
    return ", ".join(f"'{name}'" for name in names) or "none"


def _check_tensor(config: ModelConfig, spec: TensorSpec, info: TensorInfo) -> None:
    where = f"tensor '{spec.name}'"
    if info.shape_tensor:
        raise ConfigError(f"{where} is a shape tensor, which this backend does not support")
    if info.datatype != spec.datatype:
        raise ConfigError(
            f"{where}: the engine's datatype is {info.datatype}, the config's {spec.datatype}"
        )
    batching = config.max_batch_size > 0
    engine_dims = info.shape[1:] if batching else info.shape
    if (batching and not info.shape) or not _dims_agree(engine_dims, spec.dims):
        batch = f" (max_batch_size {config.max_batch_size}: its first dim is the batch)"
        raise ConfigError(
            f"{where}: the engine's shape {list(info.shape)} does not match the config's dims "
            f"{list(spec.dims)}{batch if batching else ''}"
        )
    if batching and info.shape[0] != -1 and not (info.shape[0] == 1 == config.max_batch_size):
        raise ConfigError(
            f"{where}: the engine's batch dim is fixed at {info.shape[0]}; with max_batch_size "
            f"{config.max_batch_size} it must be dynamic (-1)"
        )


def _dims_agree(engine: Shape, config: tuple[int, ...]) -> bool:
    """Same rank, and each dim equal where neither is -1 (variable)."""
    return len(engine) == len(config) and all(
        a == b or -1 in (a, b) for a, b in zip(engine, config, strict=True)
    )


def _check_max_batch(config: ModelConfig, engine_io: list[TensorInfo]) -> None:
    largest = max_profile_batch(engine_io)
    if config.max_batch_size > largest:
        per_profile = ", ".join(str(batch) for batch in profile_batches(engine_io))
        raise ConfigError(
            f"max_batch_size {config.max_batch_size} exceeds the largest batch the engine's "
            f"optimisation profiles admit, {largest} (per profile: {per_profile or 'none'})"
        )


def profile_batches(infos: list[TensorInfo]) -> list[int]:
    """Per optimisation profile, the largest batch it admits: the least max batch of its inputs."""
    inputs = [info for info in infos if info.is_input and info.ranges and info.shape]
    count = min((len(info.ranges) for info in inputs), default=0)
    return [min(info.ranges[p][2][0] for info in inputs) for p in range(count)]


def max_profile_batch(infos: list[TensorInfo]) -> int:
    """The largest batch some optimisation profile admits for every input; 0: none known."""
    return max(profile_batches(infos), default=0)


def choose_profile(
    ranges: Sequence[Mapping[str, Range]], shapes: Mapping[str, Shape], preferred: int
) -> int:
    """The optimisation profile a batch of input ``shapes`` runs on.

    ``preferred`` when it admits every shape (each dim within [min, max]); else, of those that
    admit them, the one whose opt shapes are nearest (the least sum of dim differences, the
    lowest index on a tie). InvalidInput, naming the inputs, their shapes and the ranges, when
    none admits them.
    """
    if 0 <= preferred < len(ranges) and _admits(ranges[preferred], shapes):
        return preferred
    admitting = [p for p, profile in enumerate(ranges) if _admits(profile, shapes)]
    if not admitting:
        raise InvalidInput(_refusal(ranges, shapes))
    return min(admitting, key=lambda p: _distance(ranges[p], shapes))


def _admits(profile: Mapping[str, Range], shapes: Mapping[str, Shape]) -> bool:
    return all(name in profile and _within(shape, profile[name]) for name, shape in shapes.items())


def _within(shape: Shape, span: Range) -> bool:
    low, _, high = span
    return len(shape) == len(low) and all(
        lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)
    )


def _distance(profile: Mapping[str, Range], shapes: Mapping[str, Shape]) -> int:
    return sum(
        abs(d - opt)
        for name, shape in shapes.items()
        for d, opt in zip(shape, profile[name][1], strict=True)
    )


def _refusal(ranges: Sequence[Mapping[str, Range]], shapes: Mapping[str, Shape]) -> str:
    refused = []
    for name, shape in shapes.items():
        if all(name in profile and _within(shape, profile[name]) for profile in ranges):
            continue
        spans = "; ".join(
            f"profile {p} {_span(profile.get(name))}" for p, profile in enumerate(ranges)
        )
        refused.append(f"input '{name}' has shape {list(shape)} ({spans})")
    return "no optimisation profile of the engine admits the batch: " + ", ".join(refused)


def _span(span: Range | None) -> str:
    if span is None:
        return "has no such input"
    return f"admits {list(span[0])} to {list(span[2])}"
