"""The GPU section's models, built per runtime, and each one's raw limit on one instance.

Models: ``bert_mini`` (the example: 4 layers, d_model 256) and ``bert_base``, the same
encoder at BERT-base size (``BertMini(seq_len=128, d_model=768, layers=12, nhead=12,
dim_feedforward=3072)``, about 110M parameters, weights from ``torch.manual_seed(4)``). Both
come from ``examples/build_models.py``, loaded by path; ``bert_base`` is added to that copy's
``MODELS`` (not to the file), so its ``build_model`` and ``export_onnx`` build it as they
build the examples.

Each runtime gets a repository of its own under the root, so each mesh loads only its
runtime's models: ``torch/<model>`` (``model.pt``: bert_mini's hard-linked from
``examples/models`` when built there, else built), ``onnxruntime/<model>_onnx``
(``export_onnx``: the seeded module, dynamic batch dimension) and ``tensorrt/<model>_trt``
(``examples/build_tensorrt.py`` from the ONNX model directory, FP32, two optimisation
profiles of batch 1 to 64, opt 32, one per instance, so the instances run side by side). Every
config has ``instance_group: [{kind: KIND_GPU, count: 2}]`` (``KIND_CPU`` with ``--cpu``) and,
on the GPU, ``dynamic_batching`` of ``preferred_batch_size [32]`` within 2 ms (bert_mini's
example config prefers 8, its best on a CPU thread; on a GPU larger batches pay). What is
built is kept: with ``--repository`` a second run reuses it.

The raw limit: one instance loaded by Weir's own ``load_backend`` on device 0 (the CPU with
``--cpu``), ``.instance()`` of it (on a GPU: its own CUDA stream and pinned buffers), called
in this process with seeded batches of 1, 8, 32 and 64 rows. ``infer`` returns the outputs
on the host, so a call's time includes the copies and the wait for the GPU. Each size is
warmed up (20 calls, at least half the timed duration), then timed for at least ``min_s``;
the figure is the 20th percentile of the call times, as ``bench/raw.py`` takes it. The limit
is the best rows/s over the sizes, and the size it came at.
"""

from __future__ import annotations

import copy
import functools
import gc
import importlib
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import yaml

from bench.variants import link_or_copy
from weir.config import ModelConfig
from weir.datatypes import datatype_of, numpy_dtype
from weir.repository import load_model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
RUNTIMES = ("torch", "onnxruntime", "tensorrt")
SUFFIXES = {"torch": "", "onnxruntime": "_onnx", "tensorrt": "_trt"}
MODELS = ("bert_mini", "bert_base")
BERT_BASE = "bert_base"
BERT_BASE_SEED = 4
INSTANCES = 2
GPU_BATCHING = {"preferred_batch_size": [32], "max_queue_delay_microseconds": 2000}
TRT_PROFILE = "1:32:64"  # min:opt:max batch sizes, one profile per instance
RAW_BATCH_SIZES = (1, 8, 32, 64)
WARMUP_CALLS = 20
INT_HIGH = 1000  # token ids stay below this


@dataclass(frozen=True)
class Served:
    """One model through one runtime: the name it is served under, and its repository."""

    model: str
    runtime: str
    repository: Path

    @property
    def name(self) -> str:
        return self.model + SUFFIXES[self.runtime]


@functools.cache
def builder() -> ModuleType:
    """``examples/build_models.py`` (loaded by path), with ``bert_base`` in its ``MODELS``."""
    module = _load_example("build_models")
    module.MODELS.setdefault(BERT_BASE, _bert_base_spec(module))
    return module


def _bert_base_spec(module: ModuleType) -> Any:
    config = copy.deepcopy(module.MODELS["bert_mini"].config)
    config.update(name=BERT_BASE, dynamic_batching=dict(GPU_BATCHING))

    def build() -> Any:
        return module.BertMini(seq_len=128, d_model=768, layers=12, nhead=12, dim_feedforward=3072)

    return module.ModelSpec(seed=BERT_BASE_SEED, build=build, config=config)


def _load_example(name: str) -> ModuleType:
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"weir_bench_gpu_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_device(cpu: bool) -> None:
    """SystemExit, saying what to do, when a GPU run finds no CUDA device."""
    if cpu:
        return
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device: run with --cpu to check the plumbing")


def skip_reason(runtime: str, cpu: bool) -> str:
    """Why ``runtime`` cannot run here; empty when it can."""
    if runtime == "onnxruntime":
        return _onnxruntime_missing(cpu)
    if runtime == "tensorrt":
        if cpu:
            return "runs on CUDA devices only (--cpu)"
        try:
            importlib.import_module("tensorrt")
        except ImportError as exc:
            return f"import tensorrt fails: {exc} (pip install tensorrt-cu12)"
    return ""


def _onnxruntime_missing(cpu: bool) -> str:
    try:
        ort: Any = importlib.import_module("onnxruntime")
    except ImportError:
        return "not installed (install onnxruntime-gpu)"
    if not cpu and "CUDAExecutionProvider" not in ort.get_available_providers():
        return "no CUDAExecutionProvider (install onnxruntime-gpu)"
    return ""


def placed(config: dict[str, Any], cpu: bool) -> dict[str, Any]:
    """``config`` with the section's instance group (and, on the GPU, its batching)."""
    kind = "KIND_CPU" if cpu else "KIND_GPU"
    result = {**config, "instance_group": [{"kind": kind, "count": INSTANCES}]}
    if not cpu:
        result["dynamic_batching"] = dict(GPU_BATCHING)
    return result


def write_config(model_dir: Path, config: dict[str, Any]) -> None:
    path = model_dir / "config.yaml"
    path.unlink(missing_ok=True)  # never write through a hard link into the examples
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def build_torch(root: Path, model: str, cpu: bool) -> Path:
    """``root/torch/<model>``: the TorchScript model and its placed config."""
    target = root / "torch" / model
    model_file = target / "1" / "model.pt"
    example = EXAMPLES / "models" / model / "1" / "model.pt"
    if not model_file.exists() and example.is_file():
        model_file.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(str(example), str(model_file))
    builder().build_model(target.parent, model)  # builds only a missing model.pt
    write_config(target, placed(builder().MODELS[model].config, cpu))
    return target


def build_onnx(root: Path, model: str, cpu: bool) -> Path:
    """``root/onnxruntime/<model>_onnx``: the exported ONNX model and its config."""
    target = root / "onnxruntime" / (model + SUFFIXES["onnxruntime"])
    model_file = target / "1" / "model.onnx"
    if not model_file.exists():
        builder().export_onnx(model, model_file)
    config = {**builder().MODELS[model].config, "name": target.name, "backend": "onnxruntime"}
    write_config(target, placed(config, cpu))
    return target


def build_tensorrt(root: Path, model: str, cpu: bool) -> Path:
    """``root/tensorrt/<model>_trt``: an FP32 engine built from the ONNX model directory."""
    source = build_onnx(root, model, cpu)
    target = root / "tensorrt" / (model + SUFFIXES["tensorrt"])
    if not (target / "1" / "model.plan").exists():
        args = ["--onnx", str(source), "--out", str(target)]
        code = _load_example("build_tensorrt").main(
            [*args, *(["--profile", TRT_PROFILE] * INSTANCES)]
        )
        if code:
            raise RuntimeError(f"examples/build_tensorrt.py failed for {model} (exit {code})")
    return target


BUILDS = {"torch": build_torch, "onnxruntime": build_onnx, "tensorrt": build_tensorrt}


def prepare(root: Path, runtime: str, models: list[str], cpu: bool) -> list[Served]:
    """Build ``models`` for ``runtime`` under ``root``; what its mesh will serve."""
    built = [BUILDS[runtime](root, model, cpu) for model in models]
    return [Served(model, runtime, path.parent) for model, path in zip(models, built, strict=True)]


# --- the raw limit --------------------------------------------------------------------------


@dataclass(frozen=True)
class RawLimit:
    """One instance's time per batch, by batch size; the best rows/s and its batch size."""

    batch_ms: dict[int, float]

    @property
    def batch_size(self) -> int:
        return max(self.batch_ms, key=lambda size: size / self.batch_ms[size])

    @property
    def rows_per_s(self) -> float:
        return self.batch_size / self.batch_ms[self.batch_size] * 1e3

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_ms": self.batch_ms,
            "rows_per_s": self.rows_per_s,
            "batch_size": self.batch_size,
        }


def sample_inputs(config: ModelConfig, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded rows for every input of ``config``: token ids below 1000, or normals."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in config.input:
        shape, dtype = (batch_size, *spec.dims), numpy_dtype(spec.datatype)
        if np.issubdtype(dtype, np.integer):
            inputs[spec.name] = rng.integers(0, INT_HIGH, shape).astype(dtype)
        else:
            inputs[spec.name] = rng.standard_normal(shape).round(4).astype(dtype)
    return inputs


def request_body(served: Served) -> bytes:
    """A KServe v2 JSON request of one row, the same bytes for every request."""
    config = load_model(served.repository, served.name).config
    tensors = [
        {"name": name, "datatype": datatype_of(array), "shape": list(array.shape)}
        | {"data": array.ravel().tolist()}
        for name, array in sample_inputs(config, 1, seed=0).items()
    ]
    return json.dumps({"inputs": tensors}, separators=(",", ":")).encode()


def raw_limit(
    served: Served, device: int | None, batch_sizes: tuple[int, ...], min_s: float
) -> RawLimit:
    """The model's rows/s on one instance of Weir's backend, in this process."""
    from workers.backends import load_backend  # torch: here, not in the load processes

    entry = load_model(served.repository, served.name)
    loaded = load_backend(entry.config, entry.version_path(entry.latest), None, 1, None, device)
    instance = loaded.instance()
    batch_ms = {size: _batch_ms(instance, entry.config, size, min_s) for size in batch_sizes}
    del instance, loaded
    release_memory()
    return RawLimit(batch_ms)


def _batch_ms(instance: Any, config: ModelConfig, batch_size: int, min_s: float) -> float:
    from bench.raw import measure_batch

    inputs = sample_inputs(config, batch_size, seed=batch_size)
    return measure_batch(lambda: instance.infer(inputs), min_s, WARMUP_CALLS) * 1e3


def release_memory() -> None:
    """Drop what the raw limit loaded, so the mesh's workers have the device to themselves."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
