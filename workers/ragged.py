"""Ragged batching in a worker: ragged inputs concatenated, batch inputs, scattered outputs.

What :mod:`weir.config_ragged` describes, done to one group of requests a backend call runs:
each ragged input's elements concatenated into one 1-D array, each batch input computed from
the requests' shapes of its source input, and each scattered output cut back into the
requests' shares, each in the shape of its request's source input.
"""

from __future__ import annotations

import math

import numpy as np

from weir import datatypes
from weir.config import Backend, ModelConfig
from weir.config_ragged import BatchInput, BatchInputKind
from weir.errors import ServerError
from weir.tensors import Tensor
from weir.wire import InferRequest

# The backends that take a whole batch as one array per input (not one request at a time).
CONCATENATING = frozenset(
    {Backend.PYTORCH, Backend.ONNXRUNTIME, Backend.OPENVINO, Backend.TENSORRT}
)


class Ragged:
    """A model's ragged inputs, batch inputs and scattered outputs."""

    def __init__(self, config: ModelConfig) -> None:
        concatenates = config.backend in CONCATENATING
        ragged = {spec.name for spec in config.input if spec.allow_ragged_batch}
        self.flat = ragged if concatenates else set()  # given as one 1-D array
        self.batch_inputs = config.batch_input if concatenates else ()
        self.scattered = {
            name: output.source_input[0]
            for output in (config.batch_output if concatenates else ())
            for name in output.target_name
        }
        self.shape_free = self.flat  # inputs whose shapes may differ within a batch

    def __bool__(self) -> bool:
        return bool(self.shape_free or self.batch_inputs or self.scattered)

    def gather(self, name: str, members: list[InferRequest]) -> np.ndarray:
        """A ragged input's elements, every request's in turn, as one 1-D array."""
        return np.concatenate([r.inputs[name].to_numpy().reshape(-1) for r in members])

    def computed(self, members: list[InferRequest]) -> dict[str, np.ndarray]:
        """The batch inputs of this group of requests."""
        return {b.name: _batch_input(b, members) for b in self.batch_inputs}

    def scatter(
        self, name: str, array: np.ndarray, members: list[InferRequest], datatype: str
    ) -> list[Tensor]:
        """Each request's share of a scattered output, in the shape of its source input."""
        source = self.scattered[name]
        inner = array.shape[1:]
        counts = [r.inputs[source].element_count for r in members]
        if array.shape[0] != sum(counts):
            raise ServerError(
                f"output {name} has {array.shape[0]} rows; batch_output scatters it by input "
                f"{source}, whose requests hold {sum(counts)} elements"
            )
        bounds = np.cumsum(counts)[:-1]
        return [
            Tensor.from_numpy(part.reshape(*r.inputs[source].shape, *inner), datatype)
            for part, r in zip(np.split(array, bounds), members, strict=True)
        ]


def _batch_input(batch_input: BatchInput, members: list[InferRequest]) -> np.ndarray:
    dtype = datatypes.numpy_dtype(batch_input.data_type)
    shapes = [r.inputs[batch_input.source].shape for r in members]
    counts = [math.prod(shape) for shape in shapes]
    kind = batch_input.kind
    if kind is BatchInputKind.ELEMENT_COUNT:
        return np.array(counts, dtype=dtype)
    if kind is BatchInputKind.ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts).astype(dtype)
    if kind is BatchInputKind.ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind is BatchInputKind.MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(max(counts), dtype=dtype)
    items = np.array([shape[1:] for shape in shapes], dtype=dtype)
    return items if kind is BatchInputKind.ITEM_SHAPE else items.reshape(-1)
