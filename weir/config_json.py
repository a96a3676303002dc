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
    for tensor in raw["output"]:
        tensor.pop("allow_ragged_batch", None)  # an input's
    for batch_input in raw.get("batch_input", ()):
        batch_input["data_type"] = datatypes.PROTOCOL_TO_CONFIG[batch_input["data_type"]]
    for sample in raw.get("model_warmup", ()):
        for tensor in sample.get("inputs", {}).values():
            tensor["data_type"] = datatypes.PROTOCOL_TO_CONFIG[tensor["data_type"]]
            for source in ("zero_data", "random_data", "input_data_file"):
                if not tensor.get(source):
                    tensor.pop(source, None)  # as Triton: only the source that is set
    _sequence_types(raw.get("sequence_batching"))
    raw["platform"] = PLATFORMS[config.backend]
    raw["parameters"] = {k: {"string_value": v} for k, v in config.parameters.items()}
    return raw


def _sequence_types(sequencing: dict[str, Any] | None) -> None:
    """The datatypes of a sequence batcher's controls and states, by their config names."""
    if sequencing is None:
        return
    for control_input in sequencing.get("control_input", ()):
        for control in control_input["control"]:
            if control.get("data_type"):
                control["data_type"] = datatypes.PROTOCOL_TO_CONFIG[control["data_type"]]
            else:
                control.pop("data_type", None)
    for state in sequencing.get("state", ()):
        for tensor in (state, *state.get("initial_state", ())):
            tensor["data_type"] = datatypes.PROTOCOL_TO_CONFIG[tensor["data_type"]]
        for initial in state.get("initial_state", ()):
            for source in ("zero_data", "data_file"):
                if not initial.get(source):
                    initial.pop(source, None)  # a oneof: only the source that is set
