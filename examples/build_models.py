"""Build the example model repository (Triton layout) with seeded, reproducible weights.

Usage: ``python examples/build_models.py [--repository DIR] [--force]``

Writes ``<repository>/<name>/1/model.pt`` (TorchScript) for every model in :data:`MODELS`
whose file is missing, or for all of them with ``--force``. The ``config.yaml`` files of
``examples/models`` are committed; one is written here only when missing from the target
repository, so a complete repository can be built anywhere (tests use a temporary one).
Import :func:`build_repository` and :func:`reference_module` from tests.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml
from torch import nn

DEFAULT_REPOSITORY = Path(__file__).resolve().parent / "models"
VERSION = "1"


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


def mlp_spec(name: str, seed: int, widths: tuple[int, ...], max_batch_size: int = 64) -> ModelSpec:
    config = {
        "name": name,
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "input": [_fp32("INPUT0", [widths[0]])],
        "output": [_fp32("OUTPUT0", [widths[-1]])],
        "dynamic_batching": {"max_queue_delay_microseconds": 2000},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    return ModelSpec(seed=seed, build=lambda: MLP(widths), config=config)


# The registry: add a model here and it is built (and its config written where missing).
MODELS: dict[str, ModelSpec] = {
    "tiny_mlp": mlp_spec("tiny_mlp", seed=1, widths=(64, 256, 16)),
    "wide_mlp": mlp_spec("wide_mlp", seed=2, widths=(1024, 4096, 4096, 1000)),
}


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


def build_repository(root: Path, force: bool = False) -> list[str]:
    """Build every known model under ``root``; returns the names built."""
    return [name for name in MODELS if build_model(Path(root), name, force)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--force", action="store_true", help="rebuild models that exist")
    args = parser.parse_args(argv)
    build_repository(args.repository, force=args.force)


if __name__ == "__main__":
    main()
