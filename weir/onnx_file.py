"""The signature of a ``model.onnx``, read from its protobuf encoding without ONNX Runtime.

An ONNX file is a ``ModelProto`` message. Only the graph's inputs, outputs and initializer
names are read: every other field, the weights included, is skipped by its length, so a
model of gigabytes costs a few page reads (the file is memory-mapped). Inputs that are also
initializers are weights with a default (old IR versions list them as inputs) and are left
out, as ONNX Runtime leaves them out of its inputs.

Field numbers are those of ``onnx.proto`` (``ModelProto.graph`` = 7, ``GraphProto.input`` =
11, ``output`` = 12, ``initializer`` = 5, ``ValueInfoProto.name`` = 1, ``type`` = 2,
``TypeProto.tensor_type`` = 1, ``Tensor.elem_type`` = 1, ``shape`` = 2,
``TensorShapeProto.dim`` = 1, ``Dimension.dim_value`` = 1, ``dim_param`` = 2).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

from weir.errors import ConfigError
from weir.signature import ModelSignature, TensorSignature

# ONNX TensorProto.DataType -> KServe datatype.
ONNX_DATATYPES: dict[int, str] = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
    16: "BF16",
}
ONNX_TYPE_NAMES: dict[int, str] = {0: "undefined", 14: "complex64", 15: "complex128"}

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MODEL_GRAPH = 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 5, 11, 12
_TENSOR_NAME = 8


class _Truncated(Exception):
    """The encoding ends inside a field."""


class _Message:
    """A view of one encoded message: iterates (field number, wire type, value)."""

    def __init__(self, data: memoryview) -> None:
        self.data = data

    def fields(self) -> Iterator[tuple[int, int, int | memoryview]]:
        pos, end = 0, len(self.data)
        while pos < end:
            key, pos = self._varint(pos)
            number, wire = key >> 3, key & 7
            value: int | memoryview
            if wire == _VARINT:
                value, pos = self._varint(pos)
            elif wire == _LEN:
                length, pos = self._varint(pos)
                value, pos = self._slice(pos, length)
            elif wire in (_I64, _I32):
                value, pos = 0, pos + (8 if wire == _I64 else 4)
                if pos > end:
                    raise _Truncated
            else:
                raise ValueError(f"wire type {wire} (field {number}) is not valid here")
            yield number, wire, value

    def _varint(self, pos: int) -> tuple[int, int]:
        result, shift = 0, 0
        while True:
            if pos >= len(self.data):
                raise _Truncated
            byte = self.data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result, pos
            shift += 7
            if shift > 63:
                raise ValueError("a varint runs past 64 bits")

    def _slice(self, pos: int, length: int) -> tuple[memoryview, int]:
        if pos + length > len(self.data):
            raise _Truncated
        return self.data[pos : pos + length], pos + length

    def submessages(self, number: int) -> Iterator[_Message]:
        for field, wire, value in self.fields():
            if field == number and wire == _LEN and isinstance(value, memoryview):
                yield _Message(value)

    def first(self, number: int) -> int | memoryview | None:
        return next((value for field, _, value in self.fields() if field == number), None)

    def text(self, number: int) -> str:
        value = self.first(number)
        return bytes(value).decode() if isinstance(value, memoryview) else ""


def read_onnx_signature(path: Path) -> ModelSignature:
    """The inputs and outputs of the ONNX model at ``path``; ConfigError naming the reason."""
    try:
        if path.stat().st_size == 0:
            raise ConfigError(f"{path}: the file is empty, not an ONNX model")
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            result = _parse(path, mapped)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the model: {exc}") from exc
    if isinstance(result, str):
        raise ConfigError(f"{path}: {result}")
    return result


def _parse(path: Path, mapped: mmap.mmap) -> ModelSignature | str:
    # Errors come back as text: a live exception's frames would still hold views of the
    # mapping, and a mapping with views cannot be closed.
    view = memoryview(mapped)
    try:
        return _signature(path, _Message(view))
    except _Truncated:
        return "the ONNX model is truncated (a field runs past the end of the file)"
    except (ValueError, UnicodeDecodeError) as exc:
        return f"not a valid ONNX model: {exc}"
    except ConfigError as exc:
        return str(exc).removeprefix(f"{path}: ")
    finally:
        view.release()


def _signature(path: Path, model: _Message) -> ModelSignature:
    graph = next(model.submessages(_MODEL_GRAPH), None)
    if graph is None:
        raise ConfigError(f"{path}: not an ONNX model (it holds no graph)")
    weights = {t.text(_TENSOR_NAME) for t in graph.submessages(_GRAPH_INITIALIZER)}
    inputs = [_tensor(path, v) for v in graph.submessages(_GRAPH_INPUT)]
    outputs = tuple(_tensor(path, v) for v in graph.submessages(_GRAPH_OUTPUT))
    if not outputs:
        raise ConfigError(f"{path}: not an ONNX model (its graph has no outputs)")
    return ModelSignature(path, tuple(t for t in inputs if t.name not in weights), outputs)


def _tensor(path: Path, value_info: _Message) -> TensorSignature:
    name = value_info.text(1)
    type_proto = value_info.first(2)
    if not isinstance(type_proto, memoryview):
        raise ConfigError(f"{path}: tensor {name!r} declares no type")
    tensor_type = _Message(type_proto).first(1)
    if not isinstance(tensor_type, memoryview):
        return TensorSignature(name, "<not a tensor>", None)
    tensor = _Message(tensor_type)
    elem = tensor.first(1)
    elem_type = elem if isinstance(elem, int) else 0
    datatype = ONNX_DATATYPES.get(elem_type) or f"<{ONNX_TYPE_NAMES.get(elem_type, elem_type)}>"
    shape = tensor.first(2)
    dims = _dims(_Message(shape)) if isinstance(shape, memoryview) else None
    return TensorSignature(name, datatype, dims)


def _dims(shape: _Message) -> tuple[int, ...]:
    dims: list[int] = []
    for dim in shape.submessages(1):
        value = dim.first(1)
        # dim_param (a symbol) or no value at all: a dynamic dimension.
        dims.append(_int64(value) if isinstance(value, int) else -1)
    return tuple(d if d > 0 else -1 for d in dims)


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
