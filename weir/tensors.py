"""A tensor as it crosses the mesh: datatype, shape and raw little-endian bytes.

The gateway builds tensors from JSON lists or binary bodies, workers turn them into numpy
arrays (zero-copy for fixed-size types) and back. Nothing inside the mesh holds a tensor as
a Python list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from weir import datatypes
from weir.errors import InvalidInput

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class Tensor:
    """One named tensor's payload. ``data`` is row-major, little-endian, no padding."""

    datatype: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def element_count(self) -> int:
        return math.prod(self.shape)

    def to_numpy(self) -> np.ndarray:
        """A numpy view of the data (an object array of ``bytes`` for BYTES)."""
        import numpy as np  # imported on use: the batcher never looks into a tensor

        if self.datatype == datatypes.BYTES:
            elements = datatypes.deserialize_bytes(self.data, self.element_count)
            array = np.empty(len(elements), dtype=object)
            array[:] = elements
            return array.reshape(self.shape)
        dtype = datatypes.numpy_dtype(self.datatype)
        return np.frombuffer(self.data, dtype=dtype).reshape(self.shape)

    @classmethod
    def from_numpy(cls, array: np.ndarray, datatype: str | None = None) -> Tensor:
        import numpy as np

        datatype = datatype or datatypes.datatype_of(array)
        shape = tuple(int(d) for d in array.shape)
        if datatype == datatypes.BYTES:
            elements = [_as_bytes(e) for e in array.reshape(-1)]
            return cls(datatype, shape, datatypes.serialize_bytes(elements))
        dtype = datatypes.numpy_dtype(datatype)
        return cls(datatype, shape, np.ascontiguousarray(array, dtype=dtype).tobytes())

    def to_wire(self) -> dict[str, Any]:
        return {"datatype": self.datatype, "shape": list(self.shape), "data": self.data}

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> Tensor:
        return cls(raw["datatype"], tuple(raw["shape"]), raw["data"])

    def check_size(self, name: str = "", model: str = "") -> None:
        """Raise InvalidInput unless ``data`` holds exactly ``shape``'s elements.

        The message is Triton's, naming the input ``name`` of ``model``.
        """
        size = datatypes.element_size(self.datatype)
        where = f"input '{name}' for model '{model}'"
        if size is None:
            count = datatypes.count_bytes_elements(self.data)
            if count != self.element_count:
                raise InvalidInput(
                    f"unexpected number of string elements {count} for inference {where}, "
                    f"expecting {self.element_count}"
                )
            return
        expected = self.element_count * size
        if len(self.data) != expected:
            raise InvalidInput(
                f"input byte size mismatch for {where}. Expected {expected}, got {len(self.data)}"
            )


def _as_bytes(element: object) -> bytes:
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode()
    return str(element).encode()
