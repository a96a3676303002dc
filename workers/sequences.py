"""A sequence model's batch in a worker: control inputs, implicit state in, state out.

Before a batch runs, each request of a sequence gets the model's control inputs (START, END,
READY, CORRID, as its ``sequence_batching`` says) and, for each implicit ``state``, its
input: the state its sequence's previous request left, or the initial state on a start. The
states are read from the model's sequence hash in Redis in one round trip.

After the batch, each request's state outputs are written back to that hash in the batch's
own transaction (weir.stages), with its replies and its ack: a batch that a dead worker
leaves is run again from the same states, so a sequence's state moves on exactly once per
request, whichever instance of whichever worker runs it. A request that fails leaves its
state as it was; a sequence's end drops it. A state output reaches the client only when the
config lists it in ``output`` and the client asked for it (or for every output).

The batcher runs one request of a sequence at a time (:mod:`batcher.sequences`), so the
state read here is the one the previous request wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgpack
import numpy as np

from weir import datatypes, names, wire
from weir.config import ModelConfig
from weir.config_sequence import INITIAL_STATE_FOLDER, ControlKind, StateSpec
from weir.errors import ConfigError
from weir.redis_io.link import Command, HotLink
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest


class SequenceModel:
    """What one sequence model adds around the batches a worker runs of it."""

    def __init__(self, config: ModelConfig, model_dir: Path, version: str) -> None:
        sequencing = config.sequence_batching
        if sequencing is None:
            raise ValueError(f"model '{config.name}' has no sequence_batching")
        self.batches = config.max_batch_size > 0
        self.key = names.sequence_states(config.name, version)
        self.controls = [(c.name, c.control[0]) for c in sequencing.control_input]
        self.states = sequencing.state
        self.listed = {spec.name for spec in config.output}  # outputs a client may ask for
        self.initial = {s.input_name: _initial(s, model_dir) for s in self.states}

    async def read(self, link: HotLink, requests: list[InferRequest]) -> Batch:
        """The batch's requests with the states their sequences hold now."""
        keys = [r.sequence_key for r in requests if r.sequence and not _starts(r)]
        stored: dict[str, bytes] = {}
        if self.states and keys:
            (values,) = await link.call(("HMGET", self.key, *keys))
            if isinstance(values, Exception):
                raise values
            stored = {k: v for k, v in zip(keys, values, strict=True) if v}
        return Batch(self, requests, stored)

    def control_tensor(self, request: InferRequest, kind: ControlKind, control: Any) -> Tensor:
        sequence_id, flags = request.sequence or (0, 0)
        if kind is ControlKind.CORRID:
            value: Any = str(sequence_id).encode() if control.datatype == "BYTES" else sequence_id
        else:
            flag = {
                ControlKind.START: flags & wire.SEQUENCE_START,
                ControlKind.END: flags & wire.SEQUENCE_END,
                ControlKind.READY: True,
            }[kind]
            value = control.value(bool(flag))
        dtype = object if control.datatype == "BYTES" else datatypes.numpy_dtype(control.datatype)
        array = np.array([value], dtype=dtype)
        return Tensor.from_numpy(array.reshape(1, 1) if self.batches else array, control.datatype)

    def state_tensor(self, state: StateSpec, saved: dict[str, Any]) -> Tensor:
        if state.output_name in saved:
            return Tensor.from_wire(saved[state.output_name])
        initial = self.initial[state.input_name]
        return Tensor.from_numpy(initial[np.newaxis] if self.batches else initial, state.data_type)


@dataclass
class Batch:
    """One batch of a sequence model: its requests, the states read, what the run leaves."""

    model: SequenceModel
    requests: list[InferRequest]
    stored: dict[str, bytes]
    asked: dict[str, list[str]] = field(default_factory=dict)  # the outputs each client asked

    def fill(self, requests: list[InferRequest]) -> None:
        """Give each request its control and state inputs, and ask for its state outputs."""
        model = self.model
        for request in requests:
            if request.sequence is None:
                continue
            for name, control in model.controls:
                request.inputs[name] = model.control_tensor(request, control.kind, control)
            stored = None if _starts(request) else self.stored.get(request.sequence_key)
            saved = msgpack.unpackb(stored, raw=False) if stored else {}
            for state in model.states:
                request.inputs[state.input_name] = model.state_tensor(state, saved)
            self.asked[request.id] = list(request.outputs)
            if request.outputs:
                request.outputs += [s.output_name for s in model.states]

    def finish(self, replies: list[InferReply]) -> list[Command]:
        """Each reply's state outputs, taken out of it; the commands that keep them."""
        model = self.model
        by_id = {r.id: r for r in self.requests}
        kept: dict[str, bytes] = {}
        for reply in replies:
            request = by_id[reply.id]
            if request.sequence is None or reply.error is not None or not model.states:
                continue
            states = {s.output_name: self._take(reply, s.output_name) for s in model.states}
            if all(t is not None for t in states.values()):  # else it stays as it was
                kept[request.sequence_key] = _pack(states)
        ended = {
            r.sequence_key
            for r in self.requests
            if r.sequence and r.sequence[1] & wire.SEQUENCE_END
        }
        commands: list[Command] = []
        stay = {k: v for k, v in kept.items() if k not in ended}
        if stay:
            commands.append(("HSET", model.key, *(p for pair in stay.items() for p in pair)))
        if ended:
            commands.append(("HDEL", model.key, *ended))
        return commands

    def _take(self, reply: InferReply, name: str) -> Tensor | None:
        asked = self.asked.get(reply.id, [])
        shown = name in self.model.listed and (not asked or name in asked)
        return reply.outputs.get(name) if shown else reply.outputs.pop(name, None)

    def keys(self) -> list[str]:
        """The sequences this batch ran a request of, for the batcher's credit."""
        return list(dict.fromkeys(r.sequence_key for r in self.requests if r.sequence))


def _starts(request: InferRequest) -> bool:
    return request.sequence is not None and bool(request.sequence[1] & wire.SEQUENCE_START)


def _pack(states: dict[str, Tensor | None]) -> bytes:
    return cast(bytes, msgpack.packb({k: t.to_wire() for k, t in states.items() if t}))


def _initial(state: StateSpec, model_dir: Path) -> np.ndarray:
    """A state's value on a sequence's start (without the batch dimension)."""
    dtype = object if state.data_type == "BYTES" else datatypes.numpy_dtype(state.data_type)
    if not state.initial_state:  # Triton leaves it undefined; zeros, each variable dim 1
        return _zeros([d if d > 0 else 1 for d in state.dims] or [1], dtype)
    initial = state.initial_state[0]
    shape = list(initial.dims) or [1]
    if initial.zero_data:
        return _zeros(shape, dtype)
    path = model_dir / INITIAL_STATE_FOLDER / initial.data_file
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"state {state.input_name}: cannot read {path}: {exc}") from None
    tensor = Tensor(state.data_type, tuple(shape), raw)
    try:
        return tensor.to_numpy()
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"state {state.input_name}: {path} does not hold dims {shape} of "
            f"{state.data_type}: {exc}"
        ) from None


def _zeros(shape: list[int], dtype: Any) -> np.ndarray:
    """Zeros; for BYTES, empty strings."""
    return np.full(shape, b"", dtype=object) if dtype is object else np.zeros(shape, dtype=dtype)
