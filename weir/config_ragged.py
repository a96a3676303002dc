"""Triton's ragged batching: ``allow_ragged_batch`` inputs, ``batch_input`` and ``batch_output``.

A batching model's input with ``allow_ragged_batch: true`` batches requests whatever its
shape: a runtime that takes whole batches (TorchScript, ONNX Runtime, OpenVINO, TensorRT)
gets the requests' elements concatenated into one 1-D tensor, as Triton's backends give it.
Since that tensor does not say where each request ends, ``batch_input`` adds inputs the
server computes from the batch formed (field names and kinds of ``model_config.proto``):

- ``BATCH_ELEMENT_COUNT``: each request's element count of ``source_input``, shape [requests];
- ``BATCH_ACCUMULATED_ELEMENT_COUNT``: their running sums (where each request ends);
- ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``: the same after a 0, shape [requests + 1];
- ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``: zeros of shape [the largest element count];
- ``BATCH_ITEM_SHAPE``: each request's shape of ``source_input`` past the batch dimension,
  shape [requests, rank - 1]; ``BATCH_ITEM_SHAPE_FLATTEN``: the same, flat.

A ``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE`` is an output the model returns
for the concatenated elements; each request gets its own elements, in the shape of its
``source_input``. A Python model (Triton's or Weir's handler) takes each request's tensors
apart: its ragged inputs batch as any input does, requests of equal shapes together.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from weir import datatypes

if TYPE_CHECKING:
    from weir.config import ModelConfig, TensorSpec

BATCH_INPUT_DATATYPES = frozenset({"INT32", "INT64", "FP32"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchInputKind(StrEnum):
    """What a batch input says about the batch (Triton's ``BatchInput.Kind``)."""

    ELEMENT_COUNT = "BATCH_ELEMENT_COUNT"
    ACCUMULATED_ELEMENT_COUNT = "BATCH_ACCUMULATED_ELEMENT_COUNT"
    ACCUMULATED_ELEMENT_COUNT_WITH_ZERO = "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"
    MAX_ELEMENT_COUNT_AS_SHAPE = "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"
    ITEM_SHAPE = "BATCH_ITEM_SHAPE"
    ITEM_SHAPE_FLATTEN = "BATCH_ITEM_SHAPE_FLATTEN"


class BatchInput(_Strict):
    """One ``batch_input``: an input the server computes from the batch it formed."""

    kind: BatchInputKind = BatchInputKind.ELEMENT_COUNT  # the enum's 0, left out by pbtxt
    target_name: tuple[str, ...] = Field(min_length=1, max_length=1)
    data_type: str
    source_input: tuple[str, ...] = Field(min_length=1, max_length=1)

    @field_validator("data_type")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        name = datatypes.protocol_name(value)
        if name not in BATCH_INPUT_DATATYPES:
            raise ValueError(
                f"a batch_input's data_type is TYPE_INT32, TYPE_INT64 or TYPE_FP32, not {value}"
            )
        return name

    @property
    def name(self) -> str:
        return self.target_name[0]

    @property
    def source(self) -> str:
        return self.source_input[0]


class BatchOutput(_Strict):
    """One ``batch_output``: outputs scattered to the requests by a source input's shape."""

    target_name: tuple[str, ...] = Field(min_length=1)
    kind: str = Field(
        default="BATCH_SCATTER_WITH_INPUT_SHAPE", pattern="^BATCH_SCATTER_WITH_INPUT_SHAPE$"
    )
    source_input: tuple[str, ...] = Field(min_length=1, max_length=1)


def check_ragged_fields(config: ModelConfig) -> None:
    """Batch inputs are new names, computed from inputs the model has; batch outputs too."""
    inputs = {spec.name for spec in config.input}
    if any(spec.allow_ragged_batch for spec in config.output):
        raise ValueError("allow_ragged_batch is an input's field, not an output's")
    ragged = config.batch_input or any(s.allow_ragged_batch for s in config.input)
    if ragged and not config.max_batch_size:
        raise ValueError(
            "ragged batching (allow_ragged_batch, batch_input) needs max_batch_size > 0"
        )
    for batch_input in config.batch_input:
        if batch_input.name in inputs:
            raise ValueError(
                f"batch_input {batch_input.name!r} is also in input: the server computes it"
            )
        if batch_input.source not in inputs:
            raise ValueError(f"batch_input {batch_input.name!r}: no input {batch_input.source!r}")
    for batch_output in config.batch_output:
        if batch_output.source_input[0] not in inputs:
            raise ValueError(f"batch_output: no input {batch_output.source_input[0]!r}")
        for name in batch_output.target_name:
            if config.output_spec(name) is None:
                raise ValueError(f"batch_output names {name!r}, which is not in output")


def batch_input_specs(config: ModelConfig) -> list[TensorSpec]:
    """The batch inputs as the model's inputs (1-D, computed by the server)."""
    from weir.config import TensorSpec

    return [TensorSpec(name=b.name, data_type=b.data_type, dims=(-1,)) for b in config.batch_input]


def unbatched_ranks(config: ModelConfig) -> dict[str, int]:
    """The rank the model takes, whatever it batches, of ragged inputs and batch inputs."""
    ranks = {spec.name: 1 for spec in config.input if spec.allow_ragged_batch}
    for batch_input in config.batch_input:
        ranks[batch_input.name] = 2 if batch_input.kind is BatchInputKind.ITEM_SHAPE else 1
    return ranks
