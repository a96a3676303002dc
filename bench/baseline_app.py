"""The naive baseline: a plain FastAPI app that runs the model once per request.

No batching, no queue, no Redis: what "a FastAPI PyTorch wrapper" usually is. It loads the
same ``model.pt`` files Weir serves, parses the same KServe v2 JSON bodies with the same JSON
library as Weir's gateway (orjson), runs the model under ``torch.inference_mode`` with the
same torch thread count as a Weir worker, and answers in the KServe v2 JSON shape.

The endpoint is ``async``, so the model runs in the event loop, one request at a time: on a
CPU this avoids several torch calls fighting over the same cores. Run it with
``python -m bench.baseline_app --repository examples/models --port 8001`` (uvicorn, one
process).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
import uvicorn
import yaml
from fastapi import FastAPI, Request, Response

NUMPY_DTYPES = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32}


class LoadedModel:
    """One TorchScript model and its config's input and output names."""

    def __init__(self, model_dir: Path) -> None:
        config = yaml.safe_load((model_dir / "config.yaml").read_text())
        self.name: str = config["name"]
        self.inputs = [item["name"] for item in config["input"]]
        self.outputs = [item["name"] for item in config["output"]]
        path = str(model_dir / "1" / "model.pt")
        self.module = torch.jit.load(path, map_location="cpu")  # type: ignore[no-untyped-call]
        self.module.eval()

    def infer(self, body: dict[str, Any]) -> dict[str, Any]:
        given = {item["name"]: item for item in body["inputs"]}
        args = [torch.from_numpy(_array(given[name])) for name in self.inputs]
        with torch.inference_mode():
            result = self.module(*args)
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        return {
            "model_name": self.name,
            "model_version": "1",
            "outputs": [_tensor(n, v.numpy()) for n, v in zip(self.outputs, values, strict=True)],
        }


def _array(item: dict[str, Any]) -> np.ndarray:
    dtype = NUMPY_DTYPES[item["datatype"]]
    return np.asarray(item["data"], dtype=dtype).reshape(item["shape"])


def _tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    datatype = next(k for k, v in NUMPY_DTYPES.items() if array.dtype == v)
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel()}


def load_models(repository: Path) -> dict[str, LoadedModel]:
    dirs = sorted(p.parent for p in repository.glob("*/config.yaml"))
    loaded = [LoadedModel(d) for d in dirs if (d / "1" / "model.pt").is_file()]
    return {m.name: m for m in loaded}


def create_app(repository: Path) -> FastAPI:
    models = load_models(repository)
    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200)

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: Request) -> Response:
        if model not in models:
            return Response(orjson.dumps({"error": f"unknown model: '{model}'"}), 404)
        answer = models[model].infer(orjson.loads(await request.body()))
        content = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        return Response(content, media_type="application/json")

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="naive FastAPI + torch baseline")
    parser.add_argument("--repository", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    app = create_app(args.repository)
    uvicorn.run(app, host="127.0.0.1", port=args.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
