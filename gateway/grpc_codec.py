"""KServe v2 gRPC infer messages, to Weir's parsed requests and back.

A ``ModelInferRequest`` becomes the same :class:`~gateway.codec.InferBody` an HTTP body
does, so validation and everything after it are shared. Inputs arrive either all in
``raw_input_contents`` (row-major little-endian bytes, ``BYTES`` length-prefixed: exactly
Weir's tensor data, as ``tritonclient`` sends them) or each in its typed ``contents`` field.
Outputs go back as Triton's server sends them: every tensor in ``raw_output_contents``.

Typed contents are decoded without a Python step per element: a field is serialized back to
its packed wire form (one C call) and floats (and varints of one byte) read from it as they
lie; other integers go through ``np.fromiter`` in one call; ``bytes_contents`` is framed with
numpy from the elements' lengths and their joined bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from gateway import offload
from gateway.codec import (
    MAX_ELEMENTS,
    MAX_RANK,
    InferBody,
    Precheck,
    RequestedOutput,
    class_count,
    shared_output,
)
from gateway.shared_memory import SharedMemoryRegistry, input_tensor
from weir import datatypes
from weir.errors import InvalidInput
from weir.settings import GatewaySettings
from weir.tensors import Tensor

# Triton's typed contents: the field that carries each datatype and the dtype it holds.
# FP16 and BF16 have none; they travel in raw_input_contents only.
CONTENTS_FIELDS: dict[str, tuple[str, np.dtype[Any]]] = {
    "BOOL": ("bool_contents", np.dtype("?")),
    **{t: ("int_contents", np.dtype("<i4")) for t in ("INT8", "INT16", "INT32")},
    "INT64": ("int64_contents", np.dtype("<i8")),
    **{t: ("uint_contents", np.dtype("<u4")) for t in ("UINT8", "UINT16", "UINT32")},
    "UINT64": ("uint64_contents", np.dtype("<u8")),
    "FP32": ("fp32_contents", np.dtype("<f4")),
    "FP64": ("fp64_contents", np.dtype("<f8")),
}
BYTES_FIELD = "bytes_contents"
CONTENTS_NAMES = frozenset({field for field, _ in CONTENTS_FIELDS.values()} | {BYTES_FIELD})


def parse_infer_request(
    request: Any, precheck: Precheck | None = None, shm: SharedMemoryRegistry | None = None
) -> InferBody:
    """An InferBody from a ``ModelInferRequest``; every problem is an InvalidInput.

    ``precheck`` runs on each input's name, datatype and shape before its data is decoded.
    As Triton, ``raw_input_contents`` holds one entry per input not in shared memory (found
    in ``shm``), in order.
    """
    if not request.inputs:
        raise InvalidInput("request has no inputs")
    shm = SharedMemoryRegistry(0, 0) if shm is None else shm
    raw = _RawContents(request)
    inputs: dict[str, Tensor] = {}
    for tensor in request.inputs:
        name, parsed = _parse_input(tensor, raw, precheck, shm, request.model_name)
        if name in inputs:
            raise InvalidInput(f"input '{name}' appears more than once")
        inputs[name] = parsed
    raw.check_consumed()
    return InferBody(
        inputs=inputs,
        outputs=[_parse_output(output, shm) for output in request.outputs],
        parameters=_parameters(request.parameters, "request"),
        id=request.id or None,
    )


async def parse_off_loop(
    settings: GatewaySettings,
    request: Any,
    precheck: Precheck | None = None,
    shm: SharedMemoryRegistry | None = None,
) -> InferBody:
    """:func:`parse_infer_request`, in a parse thread when the request's tensors are large.

    Their size is judged by the shapes declared (4 bytes an element): a request whose data
    belies its shapes is refused by the counts checked before anything is built.
    """
    parse = functools.partial(parse_infer_request, request, precheck, shm)
    return await offload.parse(settings, 4 * _declared_elements(request), parse)


def _declared_elements(request: Any) -> int:
    # A shape of more than MAX_RANK dims is refused at once, inline.
    return sum(math.prod(t.shape) for t in request.inputs if len(t.shape) <= MAX_RANK)


class _RawContents:
    """Hands out ``raw_input_contents`` to the inputs that take them, in order.

    Each entry is copied out of the message only when its input takes it, and more entries
    than inputs are refused before any is.
    """

    def __init__(self, request: Any) -> None:
        self.entries = request.raw_input_contents
        self.count = len(self.entries)
        self.inputs = len(request.inputs)
        self.taken = 0
        if self.count > self.inputs:
            raise self._mismatch()

    def take(self) -> bytes | None:
        """The next entry; None when the request sends none (typed contents instead)."""
        if not self.count:
            return None
        if self.taken == self.count:
            raise self._mismatch()
        self.taken += 1
        entry: bytes = self.entries[self.taken - 1]
        return entry

    def check_consumed(self) -> None:
        if self.taken != self.count:
            raise self._mismatch()

    def _mismatch(self) -> InvalidInput:
        return raw_mismatch(self.count, self.inputs)


def raw_mismatch(count: int, inputs: int) -> InvalidInput:
    """The error of a request whose ``raw_input_contents`` do not match its inputs."""
    return InvalidInput(
        f"request has {count} raw_input_contents for {inputs} inputs; "
        "raw_input_contents needs one entry per input not in shared memory, in order"
    )


def _parse_input(
    tensor: Any,
    contents: _RawContents,
    precheck: Precheck | None,
    shm: SharedMemoryRegistry,
    model: str,
) -> tuple[str, Tensor]:
    name, datatype = tensor.name, tensor.datatype
    shape = check_header(name, datatype, tensor.shape)
    parameters = _parameters(tensor.parameters, f"input '{name}'")
    if precheck is not None:
        precheck(name, datatype, shape)
    ref = shm.locate(f"input '{name}'", parameters)
    if ref is not None:
        shared = input_tensor(ref, name, datatype, shape, tensor.HasField("contents"))
        shared.check_size(name, model)
        return name, shared
    raw = contents.take()
    if raw is None:
        # Sized and framed here from the counted elements: nothing left to check.
        return name, Tensor(datatype, shape, _from_contents(name, datatype, shape, tensor.contents))
    if tensor.HasField("contents"):
        raise InvalidInput(f"input '{name}' has both contents and raw_input_contents")
    parsed = Tensor(datatype, shape, raw)
    parsed.check_size(name, model)
    return name, parsed


def check_header(name: str, datatype: str, dims: Iterable[int]) -> tuple[int, ...]:
    """An input's shape, once its name, datatype and dims are checked; InvalidInput if not."""
    if not name:
        raise InvalidInput("every input needs a name")
    if datatype not in datatypes.DATATYPES:
        raise InvalidInput(f"input '{name}': unknown datatype {datatype!r}")
    return _shape(name, dims)


def _shape(name: str, dims: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(dims)
    if any(dim < 0 for dim in shape):
        raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input '{name}': shape has {len(shape)} dims, at most {MAX_RANK}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise InvalidInput(f"input '{name}': shape describes more than 2**48 elements")
    return shape


def _from_contents(name: str, datatype: str, shape: tuple[int, ...], contents: Any) -> bytes:
    """Tensor data from a typed ``contents`` field, checked to fit ``datatype``."""
    if datatype == datatypes.BYTES:
        # Counted before the elements are listed: a million empty ones cost nothing here.
        _check_count(name, shape, BYTES_FIELD, len(contents.bytes_contents))
        return serialize_elements(list(contents.bytes_contents))
    if datatype not in CONTENTS_FIELDS:
        raise InvalidInput(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    field, held = CONTENTS_FIELDS[datatype]
    count = len(getattr(contents, field))
    _check_count(name, shape, field, count)
    array = typed_values(contents, field, held, count)
    wanted = datatypes.numpy_dtype(datatype)
    converted = array.astype(wanted)
    if wanted != held and not np.array_equal(converted, array):
        raise InvalidInput(f"input '{name}': {field} holds values that do not fit {datatype}")
    return converted.tobytes()


def typed_values(contents: Any, field: str, held: np.dtype[Any], count: int) -> np.ndarray:
    """The ``count`` values of one numeric ``contents`` field, as an array of ``held``."""
    values = getattr(contents, field)
    payload = _packed_payload(contents, field)
    if payload is not None and held.kind == "f":  # fixed32/fixed64: the little-endian array
        return np.frombuffer(payload, dtype=held)
    if payload is not None and len(payload) == count:  # one-byte varints: each value < 128
        return np.frombuffer(payload, dtype=np.uint8).astype(held)
    # Longer varints: numpy reads the field in one C call (faster than decoding the wire).
    return np.fromiter(values, dtype=held, count=count)


def _packed_payload(contents: Any, field: str) -> memoryview | None:
    """The packed wire bytes of ``field``, or None when they are not one plain record."""
    only = contents
    if any(descriptor.name != field for descriptor, _ in contents.ListFields()):
        only = type(contents)()
        only.CopyFrom(contents)
        for other in CONTENTS_NAMES - {field}:
            only.ClearField(other)
    wire = memoryview(only.SerializeToString())
    if not wire:
        return wire
    tag = contents.DESCRIPTOR.fields_by_name[field].number << 3 | 2  # length-delimited
    if wire[0] != tag:
        return None
    length, offset = _varint(wire, 1)
    return wire[offset:] if offset + length == len(wire) else None


def _varint(wire: memoryview, offset: int) -> tuple[int, int]:
    """One varint at ``offset``: its value and the offset after it."""
    value = shift = 0
    while offset < len(wire):
        byte = wire[offset]
        value |= (byte & 0x7F) << shift
        offset += 1
        if byte < 0x80:
            return value, offset
        shift += 7
    return -1, offset


def serialize_elements(elements: list[bytes]) -> bytes:
    """Triton's BYTES serialization of ``elements``, framed with numpy, not per element."""
    if not elements:
        return b""
    lengths = np.fromiter(map(len, elements), dtype=np.uint64, count=len(elements))
    if int(lengths.max()) > 0xFFFFFFFF:
        raise InvalidInput("a BYTES element is longer than a uint32 length prefix holds")
    data = np.frombuffer(b"".join(elements), dtype=np.uint8)
    out = np.empty(4 * len(elements) + len(data), dtype=np.uint8)
    # Element i's prefix starts after i prefixes and the bytes of the elements before it.
    prefix_at = np.arange(len(elements), dtype=np.uint64) * np.uint64(4)
    prefix_at[1:] += np.cumsum(lengths[:-1], dtype=np.uint64)
    is_data = np.ones(len(out), dtype=bool)
    prefixes = lengths.astype("<u4").view(np.uint8).reshape(-1, 4)
    for byte in range(4):
        out[prefix_at + np.uint64(byte)] = prefixes[:, byte]
        is_data[prefix_at + np.uint64(byte)] = False
    out[is_data] = data
    return out.tobytes()


def _check_count(name: str, shape: tuple[int, ...], field: str, found: int) -> None:
    if found != math.prod(shape):
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {math.prod(shape)} elements, "
            f"{field} has {found}"
        )


def _parse_output(output: Any, shm: SharedMemoryRegistry) -> RequestedOutput:
    name = output.name
    if not name:
        raise InvalidInput("every requested output needs a name")
    parameters = _parameters(output.parameters, f"output '{name}'")
    count = class_count(name, parameters.get("classification"))
    ref = shared_output(shm, name, parameters, count, False)
    return RequestedOutput(name, classification=count, shm=ref)


def _parameters(parameters: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Plain values of a map of ``InferParameter``."""
    plain: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidInput(f"{where}: parameter '{key}' has no value")
        plain[key] = getattr(parameter, choice)
    return plain


def render_infer_response(
    model: str,
    version: str,
    request_id: str,
    outputs: list[tuple[str, Tensor]],
    shared: frozenset[str] = frozenset(),
) -> Any:
    """A ``ModelInferResponse`` with every output's data in ``raw_output_contents``.

    As Triton, an output written to shared memory (named in ``shared``) is described with an
    empty entry, so every output keeps its index.
    """
    response = service_pb2.ModelInferResponse(
        model_name=model, model_version=version, id=request_id
    )
    for name, tensor in outputs:
        response.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(b"" if name in shared else tensor.data)
    return response


def select_outputs(body: InferBody, outputs: dict[str, Tensor]) -> list[tuple[str, Tensor]]:
    """The outputs the request asked for, in its order; all of them when it named none."""
    if not body.outputs:
        return list(outputs.items())
    return [(requested.name, outputs[requested.name]) for requested in body.outputs]
