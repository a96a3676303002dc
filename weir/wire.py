"""The wire format inside the mesh: one msgpack map per stream entry.

A request entry carries ``id``, ``model``, ``version``, ``inputs`` (name -> tensor map),
the requested ``outputs``, ``parameters``, ``deadline_ms`` (unix ms), ``reply_to`` (the
gateway's reply stream) and ``ts`` (unix ns stamps for the metrics). A reply carries the
same ``id`` with either ``outputs`` or ``error`` as ``[kind, message]``. A partial reply (a
part of a streamed answer, sent while its batch still runs) also carries ``part``: its
number, from 0, in the run that sent it; the reply without ``part`` ends the answer.

Stream entries hold the encoded map under one field (``m``). A request entry also carries,
as plain fields, what the batcher needs without decoding tensors: its batch size (``n``),
deadline (``d``), priority level (``p``), id (``i``) and reply stream (``r``); a request of a
sequence also its sequence's key (``q``) and flags (``f``); under a queue policy that delays,
when it moves behind the others (``w``); counted in its priority level's queue, ``l``. A
credit entry (a worker announcing free instances) carries their number (``c``) and, for a
sequence model, the keys of the sequences whose requests the batch ran (``s``). Batch
entries and reply entries hold a msgpack list of encoded maps under ``m``: the members of a
batch, or every reply one transaction has for one gateway (one ``XADD`` per gateway, not per
reply).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack

from weir.errors import WeirError
from weir.tensors import Tensor

PAYLOAD = b"m"
BATCH_SIZE = b"n"
DEADLINE = b"d"
PRIORITY = b"p"
REQUEST_ID = b"i"
REPLY_TO = b"r"
CREDITS = b"c"
SEQUENCE = b"q"
SEQUENCE_FLAGS = b"f"
SEQUENCES = b"s"
DELAY_AT = b"w"  # when a request past its queue timeout moves behind the others (unix ms)
LEVEL_COUNTED = b"l"  # counted in its priority level's queue (its own max_queue_size)
# A request's sequence flags, Triton's values.
SEQUENCE_START = 1
SEQUENCE_END = 2


def now_ns() -> int:
    """Wall-clock stamp shared by every process of the mesh."""
    return time.time_ns()


def _pack(value: dict[str, Any]) -> bytes:
    return cast(bytes, msgpack.packb(value, use_bin_type=True))


def _unpack(raw: bytes) -> dict[str, Any]:
    value = msgpack.unpackb(raw, raw=False)
    if not isinstance(value, dict):
        raise ValueError("mesh entry is not a msgpack map")
    return value


@dataclass(slots=True)
class InferRequest:
    """One inference request as it travels from the gateway to a worker."""

    id: str
    model: str
    version: str
    inputs: dict[str, Tensor]
    reply_to: str
    deadline_ms: int
    outputs: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    ts: dict[str, int] = field(default_factory=dict)
    route: dict[str, Any] | None = None
    # A sequence model's request: the sequence id (an int or a str) and its flags.
    sequence: tuple[int | str, int] | None = None

    @property
    def sequence_key(self) -> str:
        """The sequence's key in the batcher and in Redis; empty outside a sequence."""
        return "" if self.sequence is None else sequence_key(self.sequence[0])

    def encode(self) -> bytes:
        message = {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "inputs": {name: t.to_wire() for name, t in self.inputs.items()},
            "outputs": self.outputs,
            "parameters": self.parameters,
            "deadline_ms": self.deadline_ms,
            "reply_to": self.reply_to,
            "ts": self.ts,
            "route": self.route,
        }
        if self.sequence is not None:
            message["sequence"] = list(self.sequence)
        return _pack(message)

    @classmethod
    def decode(cls, raw: bytes) -> InferRequest:
        m = _unpack(raw)
        sequence = m.get("sequence")
        return cls(
            id=m["id"],
            model=m["model"],
            version=m["version"],
            inputs={name: Tensor.from_wire(t) for name, t in m["inputs"].items()},
            outputs=list(m["outputs"]),
            parameters=dict(m["parameters"]),
            deadline_ms=int(m["deadline_ms"]),
            reply_to=m["reply_to"],
            ts=dict(m["ts"]),
            route=m.get("route"),
            sequence=(sequence[0], int(sequence[1])) if sequence else None,
        )


@dataclass(slots=True)
class InferReply:
    """The answer to one request: outputs, or an error kind and message."""

    id: str
    model: str
    version: str
    outputs: dict[str, Tensor] = field(default_factory=dict)
    error: tuple[str, str] | None = None
    ts: dict[str, int] = field(default_factory=dict)
    part: int | None = None  # a partial reply's number; None: the answer itself

    @classmethod
    def failure(cls, request: InferRequest, error: WeirError) -> InferReply:
        return cls(request.id, request.model, request.version, error=(error.kind, error.message))

    def raise_for_error(self) -> None:
        if self.error is not None:
            raise WeirError.of_kind(*self.error)

    def encode(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "outputs": {name: t.to_wire() for name, t in self.outputs.items()},
            "error": list(self.error) if self.error else None,
            "ts": self.ts,
        }
        if self.part is not None:
            message["part"] = self.part
        return _pack(message)

    @classmethod
    def decode(cls, raw: bytes) -> InferReply:
        m = _unpack(raw)
        error = m.get("error")
        return cls(
            id=m["id"],
            model=m["model"],
            version=m["version"],
            outputs={name: Tensor.from_wire(t) for name, t in m["outputs"].items()},
            error=(str(error[0]), str(error[1])) if error else None,
            ts=dict(m["ts"]),
            part=m.get("part"),
        )


def reply_id(raw: object) -> str | None:
    """The request id an encoded reply names, if it names one, however malformed the rest."""
    try:
        message = _unpack(raw) if isinstance(raw, bytes) else None
    except Exception:  # malformed is what this is for
        return None
    request_id = message.get("id") if isinstance(message, dict) else None
    return request_id if isinstance(request_id, str) else None


def request_fields(request: InferRequest, batch: int, level: int = 0) -> dict[bytes, bytes]:
    """A request stream entry: the payload plus what the batcher reads without decoding."""
    fields = {
        PAYLOAD: request.encode(),
        BATCH_SIZE: b"%d" % batch,
        DEADLINE: b"%d" % request.deadline_ms,
        REQUEST_ID: request.id.encode(),
        REPLY_TO: request.reply_to.encode(),
    }
    if level:
        fields[PRIORITY] = b"%d" % level
    if request.sequence is not None:
        fields[SEQUENCE] = request.sequence_key.encode()
        fields[SEQUENCE_FLAGS] = b"%d" % request.sequence[1]
    return fields


def encode_keys(keys: list[str]) -> bytes:
    """A credit's sequence keys."""
    return cast(bytes, msgpack.packb(keys, use_bin_type=True))


def decode_keys(raw: bytes) -> list[str]:
    keys = msgpack.unpackb(raw, raw=False)
    return [str(key) for key in keys] if isinstance(keys, list) else []


def sequence_key(sequence_id: int | str) -> str:
    """A sequence id as a key: Triton keeps the id 7 and the id "7" apart, and so does this."""
    return str(sequence_id) if isinstance(sequence_id, int) else f"'{sequence_id}"


def encode_batch(payloads: list[bytes]) -> bytes:
    """A batch entry: the member requests' encoded payloads, in arrival order."""
    return cast(bytes, msgpack.packb(payloads, use_bin_type=True))


def flat_field(flat: list[bytes], name: bytes) -> bytes:
    """The value of ``name`` in a stream entry's flat field/value list, as Redis sends it."""
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == name:
            return flat[i + 1]
    raise KeyError(name)


def reply_entries(replies: Iterable[tuple[str, bytes]]) -> dict[str, dict[bytes, bytes]]:
    """The entries that carry ``(reply stream, encoded reply)`` pairs: one per stream."""
    grouped: dict[str, list[bytes]] = {}
    for stream, payload in replies:
        grouped.setdefault(stream, []).append(payload)
    return {stream: {PAYLOAD: encode_batch(payloads)} for stream, payloads in grouped.items()}


def decode_batch(raw: bytes) -> list[bytes]:
    payloads = msgpack.unpackb(raw, raw=False)
    if not isinstance(payloads, list):
        raise ValueError("batch entry is not a msgpack list")
    return payloads
