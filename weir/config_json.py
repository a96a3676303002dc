"""A model's config in Triton's JSON form of ``model_config.proto``.

What ``GET /v2/models/{m}/config`` serves, and what a Triton Python model gets as
``args["model_config"]``.
"""

from __future__ import annotations

from typing import Any

from weir import datatypes
from weir.config import Backend, ModelConfig

PLATFORMS: dict[Backend, str] = {
    Backend.PYTORCH: "pytorch_libtorch",
    Backend.ONNXRUNTIME: "onnxruntime_onnx",
    Backend.OPENVINO: "openvino",
    Backend.TENSORRT: "tensorrt_plan",
    Backend.PYTHON: "python",
    Backend.TORCHSERVE: "torchserve",
    Backend.ENSEMBLE: "ensemble",
}


def config_json(config: ModelConfig) -> dict[str, Any]:
    """The config as Triton's JSON form of ``ModelConfig`` (what ``/config`` serves)."""
    raw = config.model_dump(mode="json", exclude_none=True)
    for key in ("input", "output"):
        for tensor in raw[key]:
            tensor["data_type"] = datatypes.PROTOCOL_TO_CONFIG[tensor["data_type"]]
    for tensor in raw["input"]:
        tensor.pop("label_filename", None)  # an output's field in model_config.proto
    for sample in raw.get("model_warmup", ()):
        for tensor in sample.get("inputs", {}).values():
            tensor["data_type"] = datatypes.PROTOCOL_TO_CONFIG[tensor["data_type"]]
            for source in ("zero_data", "random_data", "input_data_file"):
                if not tensor.get(source):
                    tensor.pop(source, None)  # as Triton: only the source that is set
    raw["platform"] = PLATFORMS[config.backend]
    raw["parameters"] = {k: {"string_value": v} for k, v in config.parameters.items()}
    return raw
