"""Small ONNX models built with ``onnx.helper`` for the tests: identities and arithmetic."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 9  # what this ONNX Runtime reads

# KServe datatype -> ONNX element type.
ELEMENT_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}

Dims = Sequence[int | str | None]


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def graph_model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, Dims]],
    outputs: list[tuple[str, int, Dims]],
    initializers: list[onnx.TensorProto] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, list(d)) for n, t, d in inputs],
        [helper.make_tensor_value_info(n, t, list(d)) for n, t, d in outputs],
        initializer=initializers or [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    return model


def identity(datatype: str, dims: Dims = ("batch", 3)) -> onnx.ModelProto:
    """INPUT0 -> OUTPUT0 unchanged."""
    element = ELEMENT_TYPES[datatype]
    return graph_model(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [("INPUT0", element, dims)],
        [("OUTPUT0", element, dims)],
    )


def add_sub(dims: Dims = ("batch", 4)) -> onnx.ModelProto:
    """Triton's classic: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (FP32)."""
    fp32 = TensorProto.FLOAT
    return graph_model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [("INPUT0", fp32, dims), ("INPUT1", fp32, dims)],
        [("OUTPUT0", fp32, dims), ("OUTPUT1", fp32, dims)],
    )


def reshape_by_three() -> onnx.ModelProto:
    """INPUT0 [batch, n] reshaped to [-1, 3]: fails in the runtime when n is not 3."""
    fp32 = TensorProto.FLOAT
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 3])
    return graph_model(
        [helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])],
        [("INPUT0", fp32, ("batch", None))],
        [("OUTPUT0", fp32, ("batch", 3))],
        initializers=[shape],
    )
