"""KServe v2 tensor datatypes: protocol names, config names, numpy dtypes, BYTES encoding.

Tensors cross the mesh as raw little-endian bytes. ``BYTES`` tensors use Triton's
serialization: each element is a 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct

import numpy as np

from weir.errors import InvalidInput

# Protocol datatype -> numpy dtype (little-endian). BYTES has no fixed dtype (object array).
NUMPY_DTYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
BYTES = "BYTES"
# BF16 has no numpy dtype: it travels as raw 2-byte words.
BF16 = "BF16"
DATATYPES: frozenset[str] = frozenset([*NUMPY_DTYPES, BYTES, BF16])

# model_config.proto names <-> protocol names.
CONFIG_TO_PROTOCOL: dict[str, str] = {
    **{f"TYPE_{name}": name for name in NUMPY_DTYPES},
    "TYPE_STRING": BYTES,
    "TYPE_BF16": BF16,
}
PROTOCOL_TO_CONFIG: dict[str, str] = {v: k for k, v in CONFIG_TO_PROTOCOL.items()}


def protocol_name(value: str) -> str:
    """The protocol name of a config (``TYPE_FP32``) or protocol (``FP32``) datatype name.

    Raises ValueError, so that a config's validator reports it against its field.
    """
    name = CONFIG_TO_PROTOCOL.get(value, value)
    if name not in DATATYPES:
        known = ", ".join(sorted(CONFIG_TO_PROTOCOL))
        raise ValueError(f"unknown data_type {value!r}; expected one of {known}")
    return name


_LENGTH = struct.Struct("<I")


def element_size(datatype: str) -> int | None:
    """Bytes per element, or None for BYTES (variable length)."""
    if datatype == BF16:
        return 2
    dtype = NUMPY_DTYPES.get(datatype)
    return None if dtype is None else dtype.itemsize


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    dtype = NUMPY_DTYPES.get(datatype)
    if dtype is None:
        raise InvalidInput(f"datatype {datatype} has no fixed-size numpy representation")
    return dtype


def datatype_of(array: np.ndarray) -> str:
    """The protocol datatype of a numpy array (object and string arrays are BYTES)."""
    name = _BY_DTYPE.get(array.dtype)  # a worker asks for every output of every request
    if name is not None:
        return name
    if array.dtype.kind in "OSU":
        return BYTES
    for name, dtype in NUMPY_DTYPES.items():
        if array.dtype.newbyteorder("<") == dtype:
            return name
    raise InvalidInput(f"numpy dtype {array.dtype} has no KServe datatype")


_BY_DTYPE: dict[np.dtype[np.generic], str] = {d: name for name, d in NUMPY_DTYPES.items()}


def serialize_bytes(elements: list[bytes]) -> bytes:
    """Triton's BYTES serialization: each element as a uint32 LE length, then its bytes."""
    parts: list[bytes] = []
    for element in elements:
        parts.append(_LENGTH.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def deserialize_bytes(raw: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """Split Triton-serialized BYTES back into elements; checks framing and count."""
    view = memoryview(raw)
    elements: list[bytes] = []
    offset = 0
    while offset < len(view):
        if offset + 4 > len(view):
            raise InvalidInput("BYTES tensor data is truncated inside a length prefix")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidInput("BYTES tensor element runs past the end of the data")
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    if count is not None and len(elements) != count:
        raise InvalidInput(f"BYTES tensor holds {len(elements)} elements, shape needs {count}")
    return elements


def count_bytes_elements(raw: bytes | memoryview) -> int:
    """How many elements Triton-serialized BYTES hold; checks the framing, copies nothing.

    What validation needs: 4-5x faster than :func:`deserialize_bytes`, which builds every
    element.
    """
    view = memoryview(raw)
    end = len(view)
    unpack = _LENGTH.unpack_from
    offset = count = 0
    while offset < end:
        if offset + 4 > end:
            raise InvalidInput("BYTES tensor data is truncated inside a length prefix")
        offset += 4 + unpack(view, offset)[0]
        count += 1
    if offset > end:
        raise InvalidInput("BYTES tensor element runs past the end of the data")
    return count
