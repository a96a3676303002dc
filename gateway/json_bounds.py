"""How much JSON structure a model's infer body can need, checked before it is parsed.

orjson builds every list, string and number of a body before a single element count is
compared, holding the GIL throughout: 60 MB of one-element lists took 10 s and 2 GB. What
costs is structure, not bytes (a one-element list about 440 ns, a byte of whitespace or of a
long string about 1.5 ns), and a model's config bounds the structure of a valid body.

Its tokens are the commas, ``[`` and ``{`` outside strings. A nested list of n elements has
n - 1 commas however it nests, and as many lists as its nesting (for a shape nested as
Triton's clients nest it: 1 + d0 + d0*d1 + ...); beside them a body has a few for its
inputs, parameters and outputs (``json_extra_items``). So at most ``max_batch_size`` rows of
each input's dims bound the tokens; an input with a variable dim bounds them only through the
model's ``max_input_bytes`` parameter (a BYTES element takes at least its 4-byte length
prefix). A body past the bound is a 400, as one whose data does not match its shape is:
60 MB of empty strings or of one-element lists for a [1, 64] input is refused unparsed, while
whitespace and long strings (a text full of commas among them) are not counted.

The count runs in numpy chunks of 1 MiB, letting go of the GIL, and stops at the first chunk
that takes it over: a hostile body costs one chunk's scan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from weir import datatypes
from weir.config import ModelConfig, TensorSpec
from weir.errors import InvalidInput
from weir.settings import GatewaySettings

# A BYTES element takes at least its 4-byte length prefix of a tensor's data.
MIN_BYTES_ELEMENT = 4
# Bytes of a body scanned per numpy step: temporaries stay small, and the GIL is let go
# between steps.
SCAN_CHUNK_BYTES = 1024 * 1024

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_TOKENS = tuple(map(ord, ",[{"))


@dataclass(frozen=True, slots=True)
class JsonBudget:
    """The tokens a model's JSON body may hold: its inputs' and the extra allowance."""

    model: str
    inputs: int
    extra: int

    @property
    def tokens(self) -> int:
        return self.inputs + self.extra


def for_body(config: ModelConfig, settings: GatewaySettings, size_bytes: int) -> JsonBudget | None:
    """The bound a body of ``size_bytes`` is checked against; None when it cannot be over.

    A body has fewer tokens than bytes, so a small one costs nothing here; nor does a model
    whose inputs set no bound.
    """
    if size_bytes <= settings.json_extra_items:
        return None
    return budget(config, settings.json_extra_items)


def budget(config: ModelConfig, extra: int) -> JsonBudget | None:
    """The tokens a body for ``config`` can need, from its inputs' shapes; None: unbounded."""
    total = 0
    for spec in config.input:
        tokens = _max_tokens(config, spec)
        if tokens is None:
            return None
        total += tokens
    return JsonBudget(config.name, total, extra)


def _max_tokens(config: ModelConfig, spec: TensorSpec) -> int | None:
    """An input's elements and the lists that nest them, at most."""
    limit = config.max_input_bytes
    by_bytes = None if limit is None else limit // _element_bytes(spec.datatype)
    shape = config.full_shape(spec)
    if -1 in spec.dims:
        # Nesting of a shape not known: each element may sit in lists of its own.
        return None if by_bytes is None else by_bytes * (len(shape) + 1)
    shape[0] = max(shape[0], config.max_batch_size, 1)
    elements = math.prod(shape)
    lists = sum(math.prod(shape[:k]) for k in range(len(shape)))
    if by_bytes is not None and by_bytes < elements:
        return by_bytes * (len(shape) + 1)
    return elements + lists


def _element_bytes(datatype: str) -> int:
    return datatypes.element_size(datatype) or MIN_BYTES_ELEMENT


def check(raw: bytes, bounds: JsonBudget) -> None:
    """Refuse JSON with more tokens than ``bounds`` allows, before anything is built of it."""
    limit = bounds.tokens
    if len(raw) > limit and tokens_outside_strings(raw, limit) > limit:
        raise InvalidInput(
            f"the JSON of the request holds more than {limit} commas, lists and objects: the "
            f"inputs of model '{bounds.model}' take {bounds.inputs} at most, and "
            f"WEIR_GATEWAY_JSON_EXTRA_ITEMS ({bounds.extra}) more are allowed beside them"
        )


def tokens_outside_strings(raw: bytes, enough: int | None = None) -> int:
    """The commas, ``[`` and ``{`` of JSON text that are not inside a string, by chunks.

    The count stops at the first chunk that takes it past ``enough``.
    """
    view = np.frombuffer(raw, dtype=np.uint8)
    count = 0
    scan = _StringScan()
    for start in range(0, len(view), SCAN_CHUNK_BYTES):
        chunk = view[start : start + SCAN_CHUNK_BYTES]
        outside = scan.outside_strings(chunk)
        tokens = (chunk == _TOKENS[0]) | (chunk == _TOKENS[1]) | (chunk == _TOKENS[2])
        count += int(np.count_nonzero(tokens & outside))
        if enough is not None and count > enough:
            break
    return count


class _StringScan:
    """Which bytes of consecutive chunks lie outside JSON strings.

    A quote opens or closes a string unless an odd run of backslashes precedes it; the state
    at the end of a chunk (inside a string, a run of backslashes still open) carries over.
    """

    def __init__(self) -> None:
        self.inside = 0  # 1 while a string is open at the chunk boundary
        self.escaped = False  # the next chunk's first byte follows an odd run of backslashes

    def outside_strings(self, chunk: np.ndarray) -> np.ndarray:
        quotes = chunk == _QUOTE
        quotes[self._escaped_positions(chunk)] = False
        parity = np.bitwise_xor.accumulate(quotes.view(np.uint8)) ^ np.uint8(self.inside)
        self.inside = int(parity[-1]) if len(parity) else self.inside
        # A closing quote's parity is 0 but it is no token: only tokens are counted.
        outside: np.ndarray = parity == 0
        return outside

    def _escaped_positions(self, chunk: np.ndarray) -> np.ndarray:
        """Positions that an odd run of backslashes precedes (the last one may carry)."""
        at = np.flatnonzero(chunk == _BACKSLASH)
        carried = self.escaped
        self.escaped = False
        if not len(at):
            return np.array([0] if carried and len(chunk) else [], dtype=np.intp)
        breaks = np.flatnonzero(np.diff(at) != 1)
        starts = at[np.concatenate(([0], breaks + 1))]
        ends = at[np.concatenate((breaks, [len(at) - 1]))]
        lengths = ends - starts + 1
        if carried and starts[0] == 0:
            lengths[0] += 1  # the run began in the chunk before
        positions: np.ndarray = ends[lengths % 2 == 1] + 1
        if carried and starts[0] != 0:
            positions = np.concatenate(([0], positions))
        if len(positions) and positions[-1] == len(chunk):
            self.escaped = True
            positions = positions[:-1]
        return positions
