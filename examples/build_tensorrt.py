"""Build a TensorRT engine (``model.plan``) and its Triton config from an ONNX model directory.

Usage, on a machine with a CUDA GPU and the tensorrt module (the plan is specific to the GPU
and the TensorRT version it is built with, so build it where it serves)::

    python examples/build_tensorrt.py --onnx examples/models/tiny_mlp_onnx \
        --out examples/models/tiny_mlp_trt [--profile 1:32:64 ...] [--fp16] \
        [--workspace-bytes N] [--instances N]

The source is a model directory that ONNX Runtime serves. Its config, read as the server reads
it (completed from the model where it lacks ``input`` or ``output``), gives the new model its
tensors, ``max_batch_size`` and ``dynamic_batching``; the ``model.onnx`` of its latest served
version goes through TensorRT's ONNX parser.

Each ``--profile MIN:OPT:MAX`` is one optimisation profile, in batch sizes; an input's other
dims are the ONNX model's, or the config's where the ONNX model leaves them dynamic. Without
one: a single profile, batch 1 to ``max_batch_size`` with ``max_batch_size // 2`` (or 1)
optimal. The backend runs one batch at a time on a profile, so give a profile per instance
(repeat one) for the instances on a GPU to run side by side. ``--fp16`` lets TensorRT use FP16
kernels (the tensors stay as the config says); ``--workspace-bytes`` caps its workspace.

Writes ``<out>/<version>/model.plan`` and ``<out>/config.pbtxt``: platform ``tensorrt_plan``,
named after ``<out>``, ``instance_group`` of kind ``KIND_GPU`` with one instance per profile
unless ``--instances`` says.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from weir.autocomplete import model_path
from weir.config import Backend, ModelConfig, TensorSpec
from weir.datatypes import PROTOCOL_TO_CONFIG
from weir.errors import ConfigError
from weir.repository import ModelEntry, load_model

PLAN_FILE = "model.plan"
CONFIG_FILE = "config.pbtxt"

Batch = tuple[int, int, int]  # a profile's min, opt and max batch sizes
Shape = tuple[int, ...]
Range = tuple[Shape, Shape, Shape]  # an input's min, opt and max shapes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--onnx", type=Path, required=True, help="the ONNX model's directory")
    parser.add_argument("--out", type=Path, required=True, help="the new model's directory")
    parser.add_argument(
        "--profile",
        type=parse_profile,
        action="append",
        default=[],
        help="MIN:OPT:MAX batch sizes of one optimisation profile (repeatable)",
    )
    parser.add_argument("--fp16", action="store_true", help="let TensorRT use FP16 kernels")
    parser.add_argument("--workspace-bytes", type=int, default=0, help="workspace limit")
    parser.add_argument("--instances", type=int, default=0, help="default: one per profile")
    parser.add_argument("--version", default="1", help="the version directory to write")
    return parser.parse_args(argv)


def parse_profile(text: str) -> Batch:
    """``MIN:OPT:MAX`` as batch sizes, 1 <= MIN <= OPT <= MAX."""
    try:
        low, opt, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a profile is MIN:OPT:MAX batch sizes, such as 1:8:16"
        ) from None
    if not 1 <= low <= opt <= high:
        raise argparse.ArgumentTypeError(f"{text!r}: a profile needs 1 <= MIN <= OPT <= MAX")
    return low, opt, high


def default_profile(config: ModelConfig) -> Batch:
    """Batch 1 to ``max_batch_size``, optimal at half of it (at least 1)."""
    top = max(config.max_batch_size, 1)
    return 1, max(top // 2, 1), top


def check_profiles(config: ModelConfig, profiles: list[Batch]) -> None:
    """ConfigError when no profile reaches ``max_batch_size``: the backend would refuse it."""
    largest = max(high for _, _, high in profiles)
    if config.max_batch_size > largest:
        raise ConfigError(
            f"model '{config.name}': max_batch_size {config.max_batch_size} needs a profile "
            f"whose MAX reaches it; the largest is {largest}"
        )


def profile_shapes(
    config: ModelConfig, onnx_shapes: dict[str, Shape], batch: Batch
) -> dict[str, Range]:
    """Each config input's (min, opt, max) shapes in the profile of ``batch`` sizes.

    ``onnx_shapes``: the ONNX model's input shapes, -1 where dynamic. A model that does not
    batch (``max_batch_size`` 0) has fixed shapes: min, opt and max alike.
    """
    return {
        spec.name: _input_range(config, spec, onnx_shapes[spec.name], batch)
        for spec in config.input
    }


def _input_range(config: ModelConfig, spec: TensorSpec, onnx_shape: Shape, batch: Batch) -> Range:
    batching = config.max_batch_size > 0
    dims = _fixed_dims(spec, onnx_shape[1:] if batching else onnx_shape)
    if not batching:
        return dims, dims, dims
    low, opt, high = batch
    return (low, *dims), (opt, *dims), (high, *dims)


def _fixed_dims(spec: TensorSpec, onnx_dims: Shape) -> Shape:
    """The ONNX model's dims, the config's where the model leaves one dynamic."""
    if len(onnx_dims) != len(spec.dims):
        raise ConfigError(
            f"input '{spec.name}': the ONNX model's dims {list(onnx_dims)} and the config's "
            f"{list(spec.dims)} differ in rank"
        )
    dims = tuple(
        onnx_dim if onnx_dim > 0 else config_dim
        for onnx_dim, config_dim in zip(onnx_dims, spec.dims, strict=True)
    )
    if any(dim < 1 for dim in dims):
        raise ConfigError(
            f"input '{spec.name}': dims {list(dims)} are dynamic (-1) in both the ONNX model and "
            "the config; give each a size in the config for the profile"
        )
    return dims


def config_text(config: ModelConfig, name: str, source: str, instances: int) -> str:
    """The new model's ``config.pbtxt``: ``config``'s tensors and batching, on the GPU."""
    lines = [
        f"# Built by examples/build_tensorrt.py from {source}: a TensorRT engine, {PLAN_FILE}.",
        f'name: "{name}"',
        'platform: "tensorrt_plan"',
        f"max_batch_size: {config.max_batch_size}",
        *_tensors("input", config.input),
        *_tensors("output", config.output),
    ]
    if config.dynamic_batching is not None:
        fields = config.dynamic_batching.model_dump(exclude_defaults=True)
        lines += _block("dynamic_batching", fields, "")
    lines += [
        "instance_group [",
        "  {",
        f"    count: {instances}",
        "    kind: KIND_GPU",
        "  }",
        "]",
    ]
    return "\n".join(lines) + "\n"


def _tensors(field: str, specs: tuple[TensorSpec, ...]) -> list[str]:
    entries = [
        [
            "  {",
            f'    name: "{spec.name}"',
            f"    data_type: {PROTOCOL_TO_CONFIG[spec.datatype]}",
            f"    dims: {_value(spec.dims)}",
            "  }",
        ]
        for spec in specs
    ]
    lines = [f"{field} ["]
    for index, entry in enumerate(entries):
        lines += entry if index == len(entries) - 1 else [*entry[:-1], "  },"]
    return [*lines, "]"]


def _block(name: str, fields: dict[str, Any], pad: str) -> list[str]:
    lines = [f"{pad}{name} {{"]
    for key, value in fields.items():
        if isinstance(value, dict):
            lines += _block(key, value, pad + "  ")
        else:
            lines.append(f"{pad}  {key}: {_value(value)}")
    return [*lines, f"{pad}}}"]


def _value(value: Any) -> str:
    """A scalar or a list in protobuf's text format; strings are enum names, left bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[ " + ", ".join(_value(item) for item in value) + " ]" if value else "[ ]"
    return str(value)


def source_model(onnx_dir: Path) -> tuple[ModelEntry, Path]:
    """The ONNX model, its config read as the server reads it, and its latest served file."""
    onnx_dir = onnx_dir.resolve()
    entry = load_model(onnx_dir.parent, onnx_dir.name)
    if entry.config.backend is not Backend.ONNXRUNTIME:
        raise ConfigError(
            f"{entry.config_file}: backend '{entry.config.backend.value}', not onnxruntime"
        )
    return entry, model_path(entry.config, entry.version_path(entry.latest))


def build_plan(
    onnx_file: Path,
    config: ModelConfig,
    profiles: list[Batch],
    fp16: bool = False,
    workspace_bytes: int = 0,
) -> bytes:
    """The serialized engine TensorRT builds from ``onnx_file`` with one profile per batch range."""
    trt: Any = importlib.import_module("tensorrt")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10's networks are all explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_file)):
        errors = "; ".join(parser.get_error(i).desc() for i in range(parser.num_errors))
        raise ConfigError(f"{onnx_file}: TensorRT's ONNX parser refuses it: {errors}")
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    onnx_shapes = {tensor.name: _shape(tensor.shape) for tensor in inputs}
    settings = builder.create_builder_config()
    for batch in profiles:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile_shapes(config, onnx_shapes, batch).items():
            profile.set_shape(name, low, opt, high)
        settings.add_optimization_profile(profile)
    if fp16:
        settings.set_flag(trt.BuilderFlag.FP16)
    if workspace_bytes:
        settings.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    plan = builder.build_serialized_network(network, settings)
    if plan is None:
        raise ConfigError(f"{onnx_file}: TensorRT cannot build an engine (its log says why)")
    return bytes(plan)


def _shape(dims: Any) -> Shape:
    return tuple(int(dims[i]) for i in range(len(dims)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        entry, onnx_file = source_model(args.onnx)
        profiles = args.profile or [default_profile(entry.config)]
        check_profiles(entry.config, profiles)
        plan = build_plan(onnx_file, entry.config, profiles, args.fp16, args.workspace_bytes)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"error: building a plan needs the tensorrt module: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    (out / args.version).mkdir(parents=True, exist_ok=True)
    (out / args.version / PLAN_FILE).write_bytes(plan)
    instances = args.instances or len(profiles)
    (out / CONFIG_FILE).write_text(
        config_text(entry.config, out.resolve().name, entry.config.name, instances)
    )
    print(f"wrote {out / args.version / PLAN_FILE} ({len(plan)} bytes) and {out / CONFIG_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
