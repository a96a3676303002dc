"""Triton's ``sequence_batching``: stateful models, each sequence's requests in order.

The field names and their meaning are those of ``model_config.proto``:

- ``control_input``: model inputs the server fills for each request. ``CONTROL_SEQUENCE_START``,
  ``_END`` and ``_READY`` as a false/true pair of ``int32_false_true``, ``fp32_false_true``
  or ``bool_false_true``; ``CONTROL_SEQUENCE_CORRID`` as the request's sequence id in its
  ``data_type`` (``TYPE_UINT64``, ``TYPE_INT64``, ``TYPE_UINT32``, ``TYPE_INT32`` or
  ``TYPE_STRING``). Each control tensor holds one element per request row.
- ``state``: implicit state. The model takes ``input_name`` and returns ``output_name``;
  the output of a sequence's request is the input of its next one. The first request of a
  sequence gets ``initial_state`` (zeros, or the raw bytes of a file in the model
  directory's ``initial_state/`` folder) or, without one, zeros with each variable dim 1.
- ``direct`` / ``oldest``: the strategy. Weir keeps a sequence's state in Redis, not in an
  instance, so any instance may run any sequence's next request and both strategies batch
  as ``oldest`` does: at most one request of a sequence per batch, the oldest first, with
  the strategy's ``preferred_batch_size`` and ``max_queue_delay_microseconds``.
- ``max_sequence_idle_microseconds``: a sequence with no request for that long ends, its
  state dropped (Triton's default: 1 s).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from weir import datatypes

if TYPE_CHECKING:
    from weir.config import ModelConfig, TensorSpec

INITIAL_STATE_FOLDER = "initial_state"
DEFAULT_IDLE_US = 1_000_000
CORRID_DATATYPES = frozenset({"UINT64", "INT64", "UINT32", "INT32", "BYTES"})
_FLAG_LISTS = ("int32_false_true", "fp32_false_true", "bool_false_true")
_FLAG_DATATYPES = {
    "int32_false_true": "INT32",
    "fp32_false_true": "FP32",
    "bool_false_true": "BOOL",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ControlKind(StrEnum):
    """What a control input tells the model (Triton's ``Control.Kind``)."""

    START = "CONTROL_SEQUENCE_START"
    READY = "CONTROL_SEQUENCE_READY"
    END = "CONTROL_SEQUENCE_END"
    CORRID = "CONTROL_SEQUENCE_CORRID"


class Control(_Strict):
    """One ``control`` of a control input: its kind and how its values are written."""

    kind: ControlKind = ControlKind.START  # the enum's 0, which config.pbtxt leaves out
    int32_false_true: tuple[int, ...] = ()
    fp32_false_true: tuple[float, ...] = ()
    bool_false_true: tuple[bool, ...] = ()
    data_type: str = ""

    @field_validator("data_type")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        return datatypes.protocol_name(value) if value else value

    @model_validator(mode="after")
    def _one_encoding(self) -> Control:
        given = [name for name in _FLAG_LISTS if getattr(self, name)]
        if self.kind is ControlKind.CORRID:
            if given or self.data_type not in CORRID_DATATYPES:
                raise ValueError(
                    f"{self.kind.value} takes a data_type (TYPE_UINT64, TYPE_INT64, "
                    "TYPE_UINT32, TYPE_INT32 or TYPE_STRING) and no false/true values"
                )
            return self
        if len(given) != 1 or len(getattr(self, given[0])) != 2 or self.data_type:
            raise ValueError(
                f"{self.kind.value} takes exactly one of {', '.join(_FLAG_LISTS)}, "
                "with two values: false, then true"
            )
        return self

    @property
    def datatype(self) -> str:
        """The protocol datatype of the control tensor."""
        if self.kind is ControlKind.CORRID:
            return self.data_type
        return next(_FLAG_DATATYPES[name] for name in _FLAG_LISTS if getattr(self, name))

    def value(self, flag: bool) -> Any:
        """The element written for ``flag`` (START, END, READY)."""
        pair = next(getattr(self, name) for name in _FLAG_LISTS if getattr(self, name))
        return pair[1] if flag else pair[0]


class ControlInput(_Strict):
    """One ``control_input``: a model input and the control that fills it."""

    name: str = Field(min_length=1)
    control: tuple[Control, ...] = Field(min_length=1, max_length=1)


class InitialState(_Strict):
    """A state's ``initial_state``: zeros or a file's bytes, with fixed dims."""

    data_type: str
    dims: tuple[int, ...] = ()
    zero_data: bool = False
    data_file: str = ""
    name: str = ""

    @field_validator("data_type")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        return datatypes.protocol_name(value)

    @model_validator(mode="after")
    def _one_source(self) -> InitialState:
        if self.zero_data == bool(self.data_file):
            raise ValueError("initial_state takes one of zero_data: true or data_file")
        if any(d < 1 for d in self.dims):
            raise ValueError(f"initial_state dims {list(self.dims)}: each dim is positive")
        if "/" in self.data_file or self.data_file in (".", ".."):
            raise ValueError(f"data_file {self.data_file!r} must name a file in initial_state/")
        return self


class StateSpec(_Strict):
    """One implicit ``state``: the input and output that carry it between requests."""

    input_name: str = Field(min_length=1)
    output_name: str = Field(min_length=1)
    data_type: str
    dims: tuple[int, ...] = ()
    initial_state: tuple[InitialState, ...] = Field(default=(), max_length=1)
    use_same_buffer_for_input_output: bool = False  # a memory hint; nothing to share here
    use_growable_memory: bool = False  # likewise

    @model_validator(mode="before")
    @classmethod
    def _listed(cls, raw: Any) -> Any:
        # config.pbtxt writes one initial_state as a message, not a list.
        if isinstance(raw, dict) and isinstance(raw.get("initial_state"), dict):
            raw = {**raw, "initial_state": [raw["initial_state"]]}
        return raw

    @field_validator("data_type")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        return datatypes.protocol_name(value)

    @model_validator(mode="after")
    def _initial_matches(self) -> StateSpec:
        for initial in self.initial_state:
            if initial.data_type != self.data_type:
                raise ValueError(
                    f"state {self.input_name}: initial_state data_type {initial.data_type} "
                    f"differs from the state's {self.data_type}"
                )
        return self


class Direct(_Strict):
    """``direct``: Triton gives each sequence a batch slot; here it batches as ``oldest``."""

    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    minimum_slot_utilization: float = Field(default=0.0, ge=0.0, le=1.0)


class Oldest(_Strict):
    """``oldest``: the oldest requests of different sequences batch together."""

    max_candidate_sequences: int = Field(default=0, ge=0)
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    preserve_ordering: bool = False


class SequenceBatching(_Strict):
    """Triton's ``sequence_batching`` block."""

    max_sequence_idle_microseconds: int = Field(default=DEFAULT_IDLE_US, ge=0)
    control_input: tuple[ControlInput, ...] = ()
    state: tuple[StateSpec, ...] = ()
    direct: Direct | None = None
    oldest: Oldest | None = None
    iterative_sequence: bool = False

    @model_validator(mode="before")
    @classmethod
    def _triton_default_idle(cls, raw: Any) -> Any:
        # Triton's 0 (what a config.pbtxt that leaves it out reads as) is its default, 1 s.
        if isinstance(raw, dict) and not raw.get("max_sequence_idle_microseconds"):
            raw = {**raw, "max_sequence_idle_microseconds": DEFAULT_IDLE_US}
        return raw

    @model_validator(mode="after")
    def _one_strategy(self) -> SequenceBatching:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("set only one of direct, oldest")
        if self.iterative_sequence:
            raise ValueError("iterative_sequence is not served by Weir")
        return self

    @property
    def preferred_batch_size(self) -> tuple[int, ...]:
        return self.oldest.preferred_batch_size if self.oldest else ()

    @property
    def max_queue_delay_microseconds(self) -> int:
        return (self.oldest or self.direct or Oldest()).max_queue_delay_microseconds

    @property
    def idle_s(self) -> float:
        return self.max_sequence_idle_microseconds / 1e6

    def control(self, kind: ControlKind) -> list[tuple[str, Control]]:
        """The control inputs of ``kind``, by input name."""
        return [(c.name, c.control[0]) for c in self.control_input if c.control[0].kind is kind]


def check_sequence_fields(config: ModelConfig) -> None:
    """The names a sequence model's controls and states use must not clash with its tensors."""
    sequence = config.sequence_batching
    if sequence is None:
        return
    if config.dynamic_batching is not None:
        raise ValueError("set only one of dynamic_batching, sequence_batching")
    preferred = sequence.preferred_batch_size
    if preferred and max(preferred) > max(config.max_batch_size, 1):
        raise ValueError(
            f"sequence_batching: preferred_batch_size {max(preferred)} exceeds max_batch_size "
            f"{config.max_batch_size}"
        )
    inputs = {spec.name for spec in config.input}
    taken: set[str] = set()
    for name in [c.name for c in sequence.control_input] + [s.input_name for s in sequence.state]:
        if name in inputs or name in taken:
            raise ValueError(
                f"sequence_batching: input {name!r} is named twice (a control or state input "
                "is filled by the server and is not listed in input)"
            )
        taken.add(name)
    outputs = [s.output_name for s in sequence.state]
    if len(set(outputs)) != len(outputs):
        raise ValueError("sequence_batching: two states share an output_name")
    for state in sequence.state:
        listed = config.output_spec(state.output_name)
        if listed is not None and listed.datatype != state.data_type:
            raise ValueError(
                f"state output {state.output_name} is listed in output as {listed.datatype}, "
                f"the state is {state.data_type}"
            )


def run_tensors(config: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs a sequence model runs with beyond those clients see.

    The control inputs (one element each), the state inputs, and the state outputs not
    already listed in ``output`` (a client may ask for those).
    """
    from weir.config import TensorSpec

    sequence = config.sequence_batching
    if sequence is None:
        return [], []
    inputs = [
        TensorSpec(name=c.name, data_type=c.control[0].datatype, dims=(1,))
        for c in sequence.control_input
    ]
    inputs += [
        TensorSpec(name=s.input_name, data_type=s.data_type, dims=s.dims or (1,))
        for s in sequence.state
    ]
    outputs = [
        TensorSpec(name=s.output_name, data_type=s.data_type, dims=s.dims or (1,))
        for s in sequence.state
        if config.output_spec(s.output_name) is None
    ]
    return inputs, outputs
