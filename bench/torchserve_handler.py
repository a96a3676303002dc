"""TorchServe's handler for the benchmark: the same batched work as a Weir worker, kept lean.

``torch-model-archiver`` packs this file with a model's ``model.pt`` and a small JSON spec
(:data:`SPEC_FILE`: the config's input and output names and the torch thread count). Each
call gets every request of a TorchServe batch: their KServe v2 JSON bodies are parsed with
orjson (the frontend is told not to decode them, ``decode_input_request=false``), the input
tensors stacked, the model run once under ``torch.inference_mode``, and the output split
back into one KServe v2 JSON answer per request, as Weir answers. What is measured is then
TorchServe's own cost around the model, not a slow handler's.

It runs inside TorchServe's Python worker, in the TorchServe venv: it imports nothing from
the checkout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

SPEC_FILE = "weir_bench_spec.json"
NUMPY_DTYPES = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32}
DATATYPES = {np.dtype(v): k for k, v in NUMPY_DTYPES.items()}


def _body(request: dict[str, Any]) -> dict[str, Any]:
    raw = request.get("body") or request.get("data")
    if isinstance(raw, dict):  # a frontend that decoded the JSON itself
        return raw
    parsed: dict[str, Any] = orjson.loads(bytes(raw or b"{}"))
    return parsed


def _array(item: dict[str, Any]) -> np.ndarray:
    dtype = NUMPY_DTYPES[item["datatype"]]
    return np.asarray(item["data"], dtype=dtype).reshape(item["shape"])


class BenchHandler:
    """One TorchScript model: batched KServe v2 JSON in, one KServe v2 JSON answer per request.

    TorchServe takes the only class of this module as the handler.
    """

    def __init__(self) -> None:
        self.module: Any = None
        self.name = ""
        self.inputs: list[str] = []
        self.outputs: list[str] = []

    def initialize(self, context: Any) -> None:
        model_dir = Path(context.system_properties["model_dir"])
        spec = json.loads((model_dir / SPEC_FILE).read_text())
        if spec["torch_threads"]:
            torch.set_num_threads(spec["torch_threads"])
        self.name, self.inputs, self.outputs = spec["name"], spec["inputs"], spec["outputs"]
        self.module = torch.jit.load(str(model_dir / "model.pt"), map_location="cpu")  # type: ignore[no-untyped-call]
        self.module.eval()

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        """Every request of the batch in one forward pass; answers in the requests' order."""
        bodies = [{item["name"]: item for item in _body(r)["inputs"]} for r in data]
        rows = [int(body[self.inputs[0]]["shape"][0]) for body in bodies]
        args = [
            torch.from_numpy(np.concatenate([_array(body[name]) for body in bodies]))
            for name in self.inputs
        ]
        with torch.inference_mode():
            result = self.module(*args)
        values = [v.numpy() for v in (result if isinstance(result, (tuple, list)) else [result])]
        bounds = np.cumsum(rows)[:-1]
        parts = [np.split(v, bounds) for v in values]
        return [self._answer([p[i] for p in parts]) for i in range(len(bodies))]

    def _answer(self, arrays: list[np.ndarray]) -> bytes:
        outputs = [
            {"name": n, "datatype": DATATYPES[a.dtype], "shape": list(a.shape), "data": a.ravel()}
            for n, a in zip(self.outputs, arrays, strict=True)
        ]
        answer = {"model_name": self.name, "model_version": "1", "outputs": outputs}
        return orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
