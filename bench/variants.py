"""The same model through other runtimes: ONNX Runtime and OpenVINO variants of a torch model.

A variant is the seeded model of ``examples/build_models.py`` exported to ONNX
(``export_onnx``) or converted from that export to OpenVINO IR (``convert_openvino``), served
as ``<model>_onnx`` or ``<model>_openvino`` with a config derived from the torch model's
``config.yaml``: the same tensors, ``max_batch_size``, ``dynamic_batching`` and
``instance_group``; only the name and the backend change. The model files are built into the
benchmark's own cache (never the example repository) and rebuilt only when missing or older
than the torch model's ``model.pt``; each run hard-links them into its fresh repository.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

logger = logging.getLogger(__name__)

VERSION = "1"
BUILDER = Path(__file__).resolve().parent.parent / "examples" / "build_models.py"


class Runtime(StrEnum):
    """What computes the model: torch (the example's ``model.pt``) or another runtime."""

    TORCH = "torch"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"


RUNTIMES = tuple(Runtime)
# The models served through every runtime. tiny_mlp is left out: its batch computes in
# microseconds, so every runtime would show the same gateway-bound rate.
RUNTIME_MODELS = ("wide_mlp", "bert_mini")
SUFFIXES = {Runtime.ONNXRUNTIME: "_onnx", Runtime.OPENVINO: "_openvino"}
# Each runtime's files in a version directory; the first is the one compared with model.pt.
MODEL_FILES = {
    Runtime.TORCH: ("model.pt",),
    Runtime.ONNXRUNTIME: ("model.onnx",),
    Runtime.OPENVINO: ("model.xml", "model.bin"),
}
# Fields of the torch config that name its file format, dropped from a variant's.
TORCH_ONLY_FIELDS = ("platform", "default_model_filename")


def parse_runtimes(text: str) -> list[Runtime]:
    """``torch,openvino`` as runtimes, in the order given; ValueError naming an unknown one."""
    chosen = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if word not in RUNTIMES:
            known = ", ".join(RUNTIMES)
            raise ValueError(f"unknown runtime {word!r} (known: {known})")
        chosen.append(Runtime(word))
    if not chosen:
        raise ValueError("no runtime given")
    return list(dict.fromkeys(chosen))


def served_name(model: str, runtime: str) -> str:
    """The name Weir serves ``model`` under through ``runtime``: ``bert_mini_onnx``..."""
    return model + SUFFIXES.get(Runtime(runtime), "")


@dataclass(frozen=True)
class Variant:
    """One model through one runtime, as the benchmark serves it."""

    model: str
    runtime: Runtime

    @property
    def name(self) -> str:
        return served_name(self.model, self.runtime)


def plan(models: list[str], runtimes: list[Runtime]) -> list[Variant]:
    """What a run serves: each model through torch and each other runtime that it has."""
    return [
        Variant(model, runtime)
        for model in models
        for runtime in runtimes
        if runtime == Runtime.TORCH or model in RUNTIME_MODELS
    ]


def variant_config(torch_config: dict[str, Any], variant: Variant) -> dict[str, Any]:
    """The torch model's config with the variant's name and backend, everything else kept."""
    config = {**torch_config, "name": variant.name, "backend": variant.runtime.value}
    for field in TORCH_ONLY_FIELDS:
        config.pop(field, None)
    return config


def write_config(source: Path, target: Path, variant: Variant) -> None:
    """``target/<variant>/config.yaml``, derived from ``source/<model>/config.yaml``."""
    torch_config = yaml.safe_load((source / variant.model / "config.yaml").read_text())
    header = (
        f"# {variant.name}: {variant.model} through {variant.runtime}, written by "
        f"bench/variants.py from {variant.model}'s config.yaml.\n"
    )
    text = yaml.safe_dump(variant_config(torch_config, variant), sort_keys=False)
    path = target / variant.name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + text)


def _fresh(files: list[Path], source: Path) -> bool:
    """Every file is there and none is older than ``source``."""
    return all(f.is_file() and f.stat().st_mtime_ns >= source.stat().st_mtime_ns for f in files)


def build(source: Path, cache: Path, variant: Variant) -> Path:
    """``cache/<variant>/1/``, its model files built unless fresh; returns that directory."""
    torch_file = source / variant.model / VERSION / "model.pt"
    onnx_file = cache / served_name(variant.model, Runtime.ONNXRUNTIME) / VERSION / "model.onnx"
    if not _fresh([onnx_file], torch_file):
        _timed(variant.model, "ONNX", lambda: _builder().export_onnx(variant.model, onnx_file))
    if variant.runtime == Runtime.OPENVINO:
        xml_file = cache / variant.name / VERSION / "model.xml"
        if not _fresh([xml_file, xml_file.with_suffix(".bin")], onnx_file):
            convert = _builder().convert_openvino
            _timed(variant.model, "OpenVINO IR", lambda: convert(onnx_file, xml_file))
    return cache / variant.name / VERSION


def _timed(model: str, what: str, step: Callable[[], None]) -> None:
    start = time.perf_counter()
    step()
    logger.info("built %s of %s in %.1f s", what, model, time.perf_counter() - start)


@functools.cache
def _builder() -> ModuleType:
    """``examples/build_models.py``, loaded by path (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("weir_bench_build_models", BUILDER)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {BUILDER}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def link_variant(source: Path, target: Path, cache: Path, variant: Variant) -> None:
    """The variant in ``target``: its derived config, its cached model files hard-linked."""
    built = build(source, cache, variant)
    write_config(source, target, variant)
    version_dir = target / variant.name / VERSION
    version_dir.mkdir(parents=True, exist_ok=True)
    for filename in MODEL_FILES[variant.runtime]:
        link_or_copy(str(built / filename), str(version_dir / filename))


def link_or_copy(src: str, dst: str) -> None:
    """A hard link (Weir refuses symlinks leading outside its repository), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
