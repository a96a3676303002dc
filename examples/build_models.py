"""Build the example model repository (Triton layout) with seeded, reproducible weights.

Usage: ``python examples/build_models.py [--repository DIR] [--force]``

Writes ``<repository>/<name>/1/model.pt`` (TorchScript) for every model in :data:`MODELS`
whose file is missing, or for all of them with ``--force``. The ``config.yaml`` files of
``examples/models`` are committed; one is written here only when missing from the target
repository, so a complete repository can be built anywhere (tests use a temporary one).

:data:`EXPORTS` are the same seeded models in other formats, for the other backends:
``model.onnx`` exported by ``torch.onnx.export`` (with a dynamic batch dimension) and
OpenVINO IR (``model.xml`` + ``model.bin``) converted from that ONNX file by
``openvino.convert_model``, FP32 weights kept. Both run offline. Their configs are Triton's
``config.pbtxt`` files, committed under ``examples/models`` and copied where missing.
Import :func:`build_repository`, :func:`reference_module`, :func:`export_onnx` and
:func:`convert_openvino` from tests and the benchmark.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml
from torch import nn

DEFAULT_REPOSITORY = Path(__file__).resolve().parent / "models"
VERSION = "1"
ONNX_OPSET = 17


class MLP(nn.Module):
    """Linear layers with ReLU between them; takes ``INPUT0`` of shape [N, widths[0]]."""

    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
            if i > 0:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(fan_in, fan_out))
        self.layers = nn.Sequential(*layers)

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return self.layers(INPUT0)


class BertMini(nn.Module):
    """A small BERT-shaped encoder: token and learned position embeddings, 4 encoder layers
    (4 heads, feed-forward 1024) unless told otherwise, mean over tokens, a 2-way head. Takes
    ``input_ids`` INT64 [N, seq_len], returns FP32 [N, 2].
    """

    def __init__(
        self,
        vocab: int = 30522,
        seq_len: int = 128,
        d_model: int = 256,
        layers: int = 4,
        nhead: int = 4,
        dim_feedforward: int = 1024,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.randn(1, seq_len, d_model) * 0.02)
        # Layers built one by one (not nn.TransformerEncoder, which deep-copies one layer)
        # so that each gets its own seeded weights.
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model, nhead=nhead, dim_feedforward=dim_feedforward, batch_first=True
            )
            for _ in range(layers)
        )
        self.head = nn.Linear(d_model, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


class ModelSpec(NamedTuple):
    """How to build one model: a seed, an eager-module factory and its ``config.yaml``.

    A NamedTuple, not a dataclass, so loading this file without registering it in
    ``sys.modules`` (``importlib.util.spec_from_file_location``) still works.
    """

    seed: int
    build: Callable[[], nn.Module]
    config: dict[str, Any]


def _fp32(name: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "data_type": "TYPE_FP32", "dims": dims}


def mlp_spec(
    name: str, seed: int, widths: tuple[int, ...], max_batch_size: int = 64, instances: int = 1
) -> ModelSpec:
    config = {
        "name": name,
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "input": [_fp32("INPUT0", [widths[0]])],
        "output": [_fp32("OUTPUT0", [widths[-1]])],
        "dynamic_batching": {"max_queue_delay_microseconds": 2000},
        "instance_group": [{"kind": "KIND_CPU", "count": instances}],
    }
    return ModelSpec(seed=seed, build=lambda: MLP(widths), config=config)


def bert_spec(name: str, seed: int, seq_len: int = 128) -> ModelSpec:
    config = {
        "name": name,
        "backend": "pytorch",
        "max_batch_size": 64,
        "input": [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": [seq_len]}],
        "output": [_fp32("logits", [2])],
        "dynamic_batching": {"preferred_batch_size": [8], "max_queue_delay_microseconds": 2000},
        # Two instances, one torch thread each on 2 cores: see the config.yaml comment.
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
    }
    return ModelSpec(seed=seed, build=lambda: BertMini(seq_len=seq_len), config=config)


# The registry: add a model here and it is built (and its config written where missing).
MODELS: dict[str, ModelSpec] = {
    "tiny_mlp": mlp_spec("tiny_mlp", seed=1, widths=(64, 256, 16)),
    "wide_mlp": mlp_spec("wide_mlp", seed=2, widths=(1024, 4096, 4096, 1000), instances=2),
    "bert_mini": bert_spec("bert_mini", seed=3),
}


class ExportSpec(NamedTuple):
    """One model of :data:`MODELS` in another format: ``onnx`` or ``openvino``."""

    source: str
    format: str


# The other formats: name -> (the MODELS entry it is exported from, the format).
EXPORTS: dict[str, ExportSpec] = {
    "tiny_mlp_onnx": ExportSpec("tiny_mlp", "onnx"),
    "bert_mini_onnx": ExportSpec("bert_mini", "onnx"),
    "bert_mini_openvino": ExportSpec("bert_mini", "openvino"),
}
MODEL_FILES = {"onnx": "model.onnx", "openvino": "model.xml"}


def reference_module(name: str) -> nn.Module:
    """The eager module behind ``name``, seeded exactly as the built model.pt, in eval mode."""
    spec = MODELS[name]
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG state alone
        torch.manual_seed(spec.seed)
        module = spec.build()
    return module.eval()


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Write via a temporary file in the same directory so no half-written file is seen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _save_config(path: Path, config: dict[str, Any]) -> None:
    text = yaml.safe_dump(config, sort_keys=False)
    _write_atomically(path, lambda tmp: tmp.write_text(text))


def _save_model(path: Path, name: str) -> None:
    scripted = torch.jit.script(reference_module(name))

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:  # a file object keeps the temp name out of the archive
            torch.jit.save(scripted, f)

    _write_atomically(path, write)


def build_model(root: Path, name: str, force: bool = False) -> bool:
    """Build one model (and its config if missing); False when model.pt exists already."""
    model_dir = root / name
    config_path = model_dir / "config.yaml"
    if not config_path.exists():
        _save_config(config_path, MODELS[name].config)
        print(f"wrote   {config_path}")
    model_path = model_dir / VERSION / "model.pt"
    if model_path.exists() and not force:
        print(f"skipped {name}: {model_path} exists (use --force to rebuild)")
        return False
    start = time.perf_counter()
    _save_model(model_path, name)
    print(f"built   {name}: {model_path} ({time.perf_counter() - start:.1f}s)")
    return True


def example_input(name: str, rows: int = 2) -> torch.Tensor:
    """A seeded input batch for the :data:`MODELS` entry ``name`` (its one input)."""
    (spec,) = MODELS[name].config["input"]
    generator = torch.Generator().manual_seed(0)
    if spec["data_type"] == "TYPE_INT64":
        return torch.randint(0, 1000, (rows, *spec["dims"]), generator=generator)
    return torch.randn((rows, *spec["dims"]), generator=generator)


def export_onnx(name: str, path: Path) -> None:
    """Export the :data:`MODELS` entry ``name`` to ONNX at ``path``, batch dimension dynamic.

    The input and output names are the config's, so the model fits its torch config.
    """
    config = MODELS[name].config
    inputs = [spec["name"] for spec in config["input"]]
    outputs = [spec["name"] for spec in config["output"]]
    dynamic = {tensor: {0: "batch"} for tensor in inputs + outputs}
    module = reference_module(name)

    def write(tmp: Path) -> None:
        with warnings.catch_warnings():
            # The TorchScript-based exporter is deprecated but needs no onnxscript, and its
            # tracer warns about Python booleans in nn.TransformerEncoderLayer's fast path.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (example_input(name),),
                str(tmp),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=dynamic,
                opset_version=ONNX_OPSET,
                dynamo=False,
            )

    _write_atomically(path, write)


def convert_openvino(onnx_path: Path, xml_path: Path) -> None:
    """Convert an ONNX model to OpenVINO IR (``xml_path`` and its ``.bin``), FP32 weights."""
    import openvino as ov

    model = ov.convert_model(str(onnx_path))
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=xml_path.parent, prefix=".ov-") as tmp:
        staged = Path(tmp) / xml_path.name
        ov.save_model(model, str(staged), compress_to_fp16=False)
        # The weights first: a reader that sees the new model.xml finds its model.bin.
        os.replace(staged.with_suffix(".bin"), xml_path.with_suffix(".bin"))
        os.replace(staged, xml_path)


def build_export(root: Path, name: str, force: bool = False) -> bool:
    """Build one of :data:`EXPORTS` (and copy its committed config if missing)."""
    spec = EXPORTS[name]
    model_dir = root / name
    _copy_committed_config(model_dir, name)
    target = model_dir / VERSION / MODEL_FILES[spec.format]
    if target.exists() and not force:
        print(f"skipped {name}: {target} exists (use --force to rebuild)")
        return False
    start = time.perf_counter()
    if spec.format == "onnx":
        export_onnx(spec.source, target)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = Path(tmp) / "model.onnx"
            export_onnx(spec.source, onnx_path)
            convert_openvino(onnx_path, target)
    print(f"built   {name}: {target} ({time.perf_counter() - start:.1f}s)")
    return True


def _copy_committed_config(model_dir: Path, name: str) -> None:
    for filename in ("config.pbtxt", "config.yaml"):
        source = DEFAULT_REPOSITORY / name / filename
        target = model_dir / filename
        if source.is_file() and not target.exists():
            _write_atomically(target, lambda tmp, s=source: shutil.copyfile(s, tmp))
            print(f"wrote   {target}")


def build_repository(root: Path, force: bool = False) -> list[str]:
    """Build every known model under ``root``; returns the names built."""
    built = [name for name in MODELS if build_model(Path(root), name, force)]
    built += [name for name in EXPORTS if build_export(Path(root), name, force)]
    return built + _sibling("minilm").build(Path(root), force)


def _sibling(name: str) -> Any:
    """Load ``examples/<name>.py`` by path: this file is loaded by path too, not as a package."""
    path = Path(__file__).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"weir_examples_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--force", action="store_true", help="rebuild models that exist")
    parser.add_argument(
        "--models",
        nargs="+",
        choices=[*MODELS, *EXPORTS],
        help="build only these (default: every model, all-MiniLM's included)",
    )
    args = parser.parse_args(argv)
    if not args.models:
        build_repository(args.repository, force=args.force)
        return
    for name in args.models:
        build = build_model if name in MODELS else build_export
        build(args.repository, name, args.force)


if __name__ == "__main__":
    main()
