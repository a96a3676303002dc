"""What the servers get: the benchmark's repository, and one KServe v2 JSON body per model.

Bodies come from the model's ``config.yaml`` (read with plain YAML, so the instrument does not
depend on Weir's internals): batch 1, every input filled with seeded values. One body serves
every server and every runtime of a model: the variants take the same tensors.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.variants import MODEL_FILES, Runtime, Variant, link_or_copy, link_variant

# Token-id-like integers stay below this so any embedding table in the examples accepts them.
INT_HIGH = 1000
NUMPY_TYPES = {"TYPE_FP32": np.float32, "TYPE_INT64": np.int64, "TYPE_INT32": np.int32}


@dataclass(frozen=True)
class InputSpec:
    """One input tensor as the config declares it (without the batch dimension)."""

    name: str
    config_type: str
    dims: tuple[int, ...]

    @property
    def datatype(self) -> str:
        return self.config_type.removeprefix("TYPE_")


def read_inputs(repository: Path, model: str) -> list[InputSpec]:
    config = yaml.safe_load((repository / model / "config.yaml").read_text())
    return [
        InputSpec(item["name"], item["data_type"], tuple(item["dims"])) for item in config["input"]
    ]


def sample(spec: InputSpec, rng: np.random.Generator, batch_size: int = 1) -> np.ndarray:
    """Seeded values of the input's type, with a leading batch dimension."""
    shape = (batch_size, *spec.dims)
    if spec.config_type not in NUMPY_TYPES:
        raise ValueError(f"the benchmark cannot make data of type {spec.config_type}")
    if spec.config_type == "TYPE_FP32":
        # Rounded so the JSON body is a realistic size, not 17 digits per float.
        return rng.standard_normal(shape).round(4).astype(np.float32)
    return rng.integers(0, INT_HIGH, shape).astype(NUMPY_TYPES[spec.config_type])


def request_body(repository: Path, model: str, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    inputs = []
    for spec in read_inputs(repository, model):
        array = sample(spec, rng)
        inputs.append(
            {
                "name": spec.name,
                "datatype": spec.datatype,
                "shape": list(array.shape),
                "data": array.ravel().tolist(),
            }
        )
    return {"inputs": inputs}


def write_body(repository: Path, model: str, path: Path) -> Path:
    path.write_text(json.dumps(request_body(repository, model), separators=(",", ":")))
    return path


def weights_bytes(repository: Path) -> int:
    """Bytes of every model file in the repository: the estimate of loaded model weights.

    Each runtime holds its own copy, so a model served through three runtimes counts three
    times.
    """
    names = [*(n for files in MODEL_FILES.values() for n in files), "model.pt2"]
    files = [f for name in names for f in repository.glob(f"*/[0-9]*/{name}")]
    return sum(f.stat().st_size for f in files)


def bench_repository(source: Path, variants: list[Variant], target: Path, cache: Path) -> Path:
    """A fresh repository of only the benchmarked models, each through its runtimes.

    Weir loads every model of its repository; serving only these keeps other examples from
    changing the memory measured or whether the mesh becomes ready. A torch model's files
    are hard-linked from ``source`` (copies across file systems), not symlinked: Weir
    refuses directories that lead outside its repository. Another runtime's files come from
    ``cache``, built there when missing or older than the torch model (:mod:`bench.variants`).
    """
    shutil.rmtree(target, ignore_errors=True)
    for variant in variants:
        if variant.runtime == Runtime.TORCH:
            shutil.copytree(
                source / variant.model, target / variant.model, copy_function=link_or_copy
            )
        else:
            link_variant(source, target, cache, variant)
    return target
