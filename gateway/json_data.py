"""The ``data`` of a JSON input, read into a tensor's bytes.

Triton's rules: the elements are row-major, flat or nested to the shape; a float tensor takes
ints and floats, an int tensor ints only, a BOOL tensor bools, BYTES strings; a value the
datatype cannot hold is refused, as are BF16 elements (binary data only). A flat list of
numbers for a float tensor takes a path in C (:func:`flat_floats`): on a wide input it is
most of a parse.
"""

from __future__ import annotations

import array
import math
from typing import Any

import numpy as np

from gateway import json_text
from weir import datatypes
from weir.errors import InvalidInput
from weir.tensors import Tensor


def tensor_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: Any, bool_free: bool = False
) -> Tensor:
    """Build a tensor from JSON ``data`` (flat or nested, row-major).

    ``bool_free``: the JSON text holds no ``true`` or ``false``, so no element is a bool.
    """
    if datatype == datatypes.BF16:
        raise InvalidInput(f"input '{name}': BF16 data must use the binary data extension")
    count = math.prod(shape)
    if bool_free and type(data) is list and len(data) == count:
        floats = flat_floats(name, datatype, data)
        if floats is not None:
            return Tensor(datatype, shape, floats)
    flat, types = json_text.flatten(name, data, limit=count)
    if len(flat) != count:
        # Past the count, flattening stopped at a level of more items than that.
        found = f"more ({len(flat)} items at one level)" if list in types else len(flat)
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} elements, data has {found}"
        )
    if datatype == datatypes.BYTES:
        return Tensor(
            datatype, shape, datatypes.serialize_bytes([_json_bytes(name, e) for e in flat])
        )
    return Tensor(datatype, shape, _numeric(name, datatype, flat, types).tobytes())


def _numeric(name: str, datatype: str, flat: list[Any], types: set[type]) -> np.ndarray:
    dtype = datatypes.numpy_dtype(datatype)
    wanted = "b" if dtype.kind == "b" else ("f" if dtype.kind == "f" else "i")
    # One pass in C over the element types; the per-element search runs only on an error.
    if not types <= _ACCEPTED_TYPES[wanted]:
        bad = next(e for e in flat if type(e) not in _ACCEPTED_TYPES[wanted])
        raise InvalidInput(f"input '{name}': {bad!r} is not a valid {datatype} value")
    try:
        with np.errstate(over="raise", invalid="ignore"):
            return np.array(flat, dtype=dtype)
    except (OverflowError, ValueError, FloatingPointError) as exc:
        raise InvalidInput(f"input '{name}': data does not fit {datatype}: {exc}") from None


# JSON element types each numpy kind accepts: ints may fill float tensors, never the reverse.
_ACCEPTED_TYPES: dict[str, set[type]] = {"b": {bool}, "i": {int}, "f": {int, float}}


def _json_bytes(name: str, element: Any) -> bytes:
    if not isinstance(element, str):
        raise InvalidInput(f"input '{name}': BYTES elements in JSON must be strings")
    return element.encode()


_FLOATS = frozenset(("FP16", "FP32", "FP64"))


def flat_floats(name: str, datatype: str, data: list[Any]) -> bytes | None:
    """A flat list of JSON numbers as a float tensor's bytes, in one pass in C; else None.

    For FP16, FP32 and FP64 data with no bool in it (the caller knows: the text holds no
    ``true`` or ``false``). ``array('d')`` takes ints and floats and refuses anything else (a
    string, null, a nested list) and an int past a double's range; those, and the other
    datatypes, take the general path (None), which says what is wrong. Each number becomes a
    double and then the tensor's type, rounded once as ``np.array`` rounds it (an int past
    2**53 excepted: rounded twice, within one unit in the last place).
    """
    if datatype not in _FLOATS:
        return None
    try:
        doubles = array.array("d", data)
    except (TypeError, OverflowError):
        return None
    dtype = datatypes.numpy_dtype(datatype)
    try:
        with np.errstate(over="raise", invalid="ignore"):
            return np.frombuffer(doubles, np.float64).astype(dtype).tobytes()
    except FloatingPointError as exc:
        raise InvalidInput(f"input '{name}': data does not fit {datatype}: {exc}") from None
