"""A ``ModelInferRequest`` bounded on its protobuf wire bytes, before protobuf decodes it.

protobuf decodes a message in one C call that holds the GIL, at a cost set by how many
elements it holds: 60 MB of empty ``bytes_contents`` is 31 million of them, and a second
of every other request's time. So ``ModelInfer`` takes its message undecoded: one up to
``parse_inline_bytes`` is decoded at once (it is cheap), a larger one is scanned first, in
a parse thread, and decoded there only if what it holds fits what its model takes.

The scan reads the message's records (tag and length) without building it: the model's
name, each input's name, datatype, shape and where its ``contents`` lie, and the sizes of
``raw_input_contents``. Each input's header is checked as decoding would check it (the
model's config bounds a fixed shape; ``max_input_bytes`` a variable one), and its contents
are counted only up to what that shape needs: packed numbers by their byte length, and
``bytes_contents`` one record at a time, stopping at the first past the bound. Records
outside the contents (inputs, outputs, parameters, raw entries, dims) are bounded by
``MAX_RECORDS`` in all. A model the gateway does not know leaves the message to decoding
and to the usual answer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from gateway import offload
from gateway.codec import MAX_RANK
from gateway.grpc_codec import check_header, raw_mismatch
from gateway.validation import precheck_input
from weir import datatypes
from weir.config import ModelConfig
from weir.errors import BodyTooLarge, InvalidInput
from weir.settings import GatewaySettings

# Wire types (groups, 3 and 4, have no place in these messages and are refused).
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
FIXED_SIZES = {FIXED64: 8, FIXED32: 4}
# Field numbers, from grpc_service.proto (tests check them against the descriptors).
MODEL_NAME, MODEL_VERSION, REQUEST_ID, INPUTS, OUTPUTS, RAW_INPUT_CONTENTS = 1, 2, 3, 5, 6, 7
TENSOR_NAME, TENSOR_DATATYPE, TENSOR_SHAPE, TENSOR_CONTENTS = 1, 2, 3, 5
# InferTensorContents: each numeric field's wire type unpacked, and its size when fixed.
NUMERIC_CONTENTS: dict[int, tuple[int, int]] = {
    **{number: (VARINT, 0) for number in (1, 2, 3, 4, 5)},  # bool, int, int64, uint, uint64
    6: (FIXED32, 4),  # fp32
    7: (FIXED64, 8),  # fp64
}
BYTES_CONTENTS = 8
BYTES_TAG = BYTES_CONTENTS << 3 | LENGTH
# Records outside tensor contents, over the whole message: thousands of inputs, outputs or
# parameters serve no model, and each costs protobuf an allocation.
MAX_RECORDS = 65_536
# The fewest bytes an element of a BYTES tensor takes in Weir's tensors (its length prefix).
BYTES_ELEMENT_SIZE = 4

Lookup = Callable[[str], ModelConfig | None]


@dataclass
class WireInput:
    """One ``InferInputTensor`` as the scan found it: its header, and where its contents lie."""

    name: str = ""
    datatype: str = ""
    dims: list[int] = field(default_factory=list)  # the first MAX_RANK + 1 at most
    rank: int = 0
    contents: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class WireRequest:
    """What the scan read of a ``ModelInferRequest``."""

    model_name: str = ""
    model_version: str = ""
    id: str = ""
    inputs: list[WireInput] = field(default_factory=list)
    raw_sizes: list[int] = field(default_factory=list)


async def decode_request(settings: GatewaySettings, wire: bytes, lookup: Lookup) -> Any:
    """The ``ModelInferRequest`` in ``wire``; InvalidInput (or BodyTooLarge) if refused.

    A small one is decoded at once; a large one is bounded, then decoded, in a parse thread.
    """
    if len(wire) <= settings.parse_inline_bytes:
        return decode(wire)
    return await offload.parse(settings, len(wire), functools.partial(_checked, wire, lookup))


def _checked(wire: bytes, lookup: Lookup) -> Any:
    check_request(wire, lookup)
    return decode(wire)


def decode(wire: bytes) -> Any:
    try:
        return service_pb2.ModelInferRequest.FromString(wire)
    except DecodeError:
        raise InvalidInput("the request is not a valid ModelInferRequest") from None


def check_request(wire: bytes, lookup: Lookup) -> WireRequest:
    """Refuse what ``wire`` holds past its model's bounds, before it is decoded."""
    request = scan_request(wire)
    if len(request.raw_sizes) > len(request.inputs):
        raise raw_mismatch(len(request.raw_sizes), len(request.inputs))
    config = lookup(request.model_name)
    if config is not None:
        for tensor in request.inputs:
            _check_input(wire, config, tensor)
    return request


def _check_input(wire: bytes, config: ModelConfig, tensor: WireInput) -> None:
    name = tensor.name
    if tensor.rank > MAX_RANK:
        raise InvalidInput(f"input '{name}': shape has {tensor.rank} dims, at most {MAX_RANK}")
    shape = check_header(name, tensor.datatype, tensor.dims)
    precheck_input(config, name, tensor.datatype, shape)
    needed = _check_input_bytes(config, name, tensor.datatype, shape)
    if sum(end - start for start, end in tensor.contents) <= needed:
        return  # every element takes a byte at least: these bytes cannot hold too many
    found = count_elements(wire, tensor.contents, needed)
    if found > needed:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {needed} elements, "
            f"its contents hold more than {needed}"
        )


def _check_input_bytes(
    config: ModelConfig, name: str, datatype: str, shape: tuple[int, ...]
) -> int:
    """The elements ``shape`` needs; BodyTooLarge (413) if they pass ``max_input_bytes``.

    That parameter is what bounds a variable shape; a request past it would be refused the
    same way once decoded.
    """
    needed = math.prod(shape)
    limit = config.max_input_bytes
    # precheck_input has matched the datatype to the model's.
    least = needed * (datatypes.element_size(datatype) or BYTES_ELEMENT_SIZE)
    if limit and least > limit:
        raise BodyTooLarge(
            f"input '{name}' of shape {list(shape)} holds {least} bytes at least, over the "
            f"max_input_bytes parameter of model '{config.name}' ({limit})"
        )
    return needed


def scan_request(wire: bytes) -> WireRequest:
    """The model, inputs and raw entries of a ``ModelInferRequest``, read without decoding."""
    scan = _Scan(wire)
    request = WireRequest()
    for number, kind, start, end in scan.records(0, len(wire)):
        if kind != LENGTH:
            continue
        if number == INPUTS:
            request.inputs.append(scan.tensor(start, end))
        elif number == RAW_INPUT_CONTENTS:
            request.raw_sizes.append(end - start)
        elif number == OUTPUTS:  # its parameters are records protobuf builds too
            scan.skim(start, end)
        elif number in (MODEL_NAME, MODEL_VERSION, REQUEST_ID):
            _set_text(request, number, wire[start:end])
    return request


def _set_text(request: WireRequest, number: int, raw: bytes) -> None:
    text = raw.decode(errors="replace")  # protobuf refuses bad UTF-8 when it decodes
    if number == MODEL_NAME:
        request.model_name = text
    elif number == MODEL_VERSION:
        request.model_version = text
    else:
        request.id = text


def head(wire: bytes) -> tuple[str, str, str]:
    """The model name, version and id of a message refused undecoded, best effort.

    They lead a message serialized by protobuf (fields in order), so only its first few
    records are read; a broken message gives what was read before the break.
    """
    request = WireRequest()
    try:
        for index, (number, kind, start, end) in enumerate(_records(wire, 0, len(wire))):
            if index >= 8:
                break
            if kind == LENGTH and number in (MODEL_NAME, MODEL_VERSION, REQUEST_ID):
                _set_text(request, number, wire[start:end])
    except InvalidInput:
        pass
    return request.model_name, request.model_version, request.id


def count_elements(wire: bytes, spans: list[tuple[int, int]], limit: int) -> int:
    """The elements of an ``InferTensorContents`` lying in ``spans``, counted to ``limit``.

    Past ``limit`` the count stops: the result is then some number above it.
    """
    count = 0
    for start, end in spans:
        count = _count_span(wire, start, end, count, limit)
        if count > limit:
            break
    return count


def _count_span(wire: bytes, start: int, end: int, count: int, limit: int) -> int:
    at = start
    while at < end and count <= limit:
        if wire[at] == BYTES_TAG and at + 1 < end and wire[at + 1] < 0x80:
            # One bytes_contents element of a short length: the common record, read fast.
            at += 2 + wire[at + 1]
            count += 1
            continue
        number, kind, value_start, at = _record(wire, at, end)
        # A record of no element (an unknown field) costs protobuf as much as one.
        count += _elements(wire, number, kind, value_start, at) or 1
    if at > end:
        raise _broken(end)
    return count


def _elements(wire: bytes, number: int, kind: int, start: int, end: int) -> int:
    """How many elements one record of ``InferTensorContents`` holds (0: not an element)."""
    if number == BYTES_CONTENTS:
        return int(kind == LENGTH)
    scalar = NUMERIC_CONTENTS.get(number)
    if scalar is None:
        return 0
    one_kind, size = scalar
    if kind == one_kind:
        return 1
    if kind != LENGTH:
        return 0
    if size:
        return (end - start) // size
    # Packed varints: each ends with the one byte of it below 0x80.
    return int(np.count_nonzero(np.frombuffer(wire, np.uint8, end - start, start) < 0x80))


class _Scan:
    """Reads records of one message, counting those outside tensor contents."""

    def __init__(self, wire: bytes) -> None:
        self.wire = wire
        self.records_read = 0

    def records(self, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        for record in _records(self.wire, start, end):
            self.records_read += 1
            if self.records_read > MAX_RECORDS:
                raise InvalidInput(
                    f"the request holds more than {MAX_RECORDS} inputs, outputs, parameters, "
                    "raw_input_contents and dims in all"
                )
            yield record

    def skim(self, start: int, end: int) -> None:
        for _ in self.records(start, end):
            pass

    def tensor(self, start: int, end: int) -> WireInput:
        found = WireInput()
        for number, kind, at, stop in self.records(start, end):
            if number == TENSOR_SHAPE:
                self._dims(found, kind, at, stop)
            elif kind != LENGTH:
                continue
            elif number == TENSOR_NAME:
                found.name = self.wire[at:stop].decode(errors="replace")
            elif number == TENSOR_DATATYPE:
                found.datatype = self.wire[at:stop].decode(errors="replace")
            elif number == TENSOR_CONTENTS:
                found.contents.append((at, stop))
        return found

    def _dims(self, found: WireInput, kind: int, start: int, end: int) -> None:
        if kind == VARINT:
            found.rank += 1
            _keep_dim(found, _varint(self.wire, start)[0])
        elif kind == LENGTH:  # packed: counted in one call, read up to one past MAX_RANK
            found.rank += _elements(self.wire, 1, LENGTH, start, end)
            at = start
            while at < end and len(found.dims) <= MAX_RANK:
                value, at = _varint(self.wire, at)
                _keep_dim(found, value)


def _keep_dim(found: WireInput, value: int) -> None:
    if len(found.dims) <= MAX_RANK:
        found.dims.append(value - (1 << 64) if value >= 1 << 63 else value)  # int64


def _records(wire: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each record in ``wire[start:end]``: its field number, wire type and value's span."""
    at = start
    while at < end:
        number, kind, value_start, at = _record(wire, at, end)
        yield number, kind, value_start, at


def _record(wire: bytes, at: int, end: int) -> tuple[int, int, int, int]:
    """The record at ``at``: field number, wire type, value start, and the offset after it."""
    key, at = _varint(wire, at)
    kind = key & 7
    start = at
    if kind == VARINT:
        at = _varint(wire, at)[1]
    elif kind == LENGTH:
        length, start = _varint(wire, at)
        at = start + length
    elif kind in FIXED_SIZES:
        at += FIXED_SIZES[kind]
    else:
        raise _broken(start)
    if at > end:
        raise _broken(end)
    return key >> 3, kind, start, at


def _varint(wire: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at``: its value and the offset after it."""
    value = shift = 0
    for offset in range(at, min(at + 10, len(wire))):
        byte = wire[offset]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset + 1
        shift += 7
    raise _broken(at)


def _broken(at: int) -> InvalidInput:
    return InvalidInput(f"the request is not a valid ModelInferRequest (broken at byte {at})")
