"""The JSON of an infer body, read as Triton reads it and never by recursion.

Non-finite floats are Triton's bare ``NaN``, ``Infinity`` and ``-Infinity`` tokens (not
standard JSON): a body with them takes a slower parse, otherwise as strict as orjson's.
Nested ``data`` is flattened a level at a time, and no element may sit as deep as Triton's
limit (``HTTP_MAX_JSON_NESTING_DEPTH``, 100 levels below ``data``). A parameter value is a
string, a number or a bool, as the KServe v2 protocol defines it; an object, a list or null
is refused naming the parameter.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import orjson

from weir.errors import InvalidInput

# Triton's HTTP_MAX_JSON_NESTING_DEPTH: no element of 'data' (itself level 0) may sit at
# level 100 or below. A protocol limit, not a resource knob: shapes have at most MAX_RANK
# dims, so no valid request nests 'data' even that deep.
TRITON_MAX_JSON_NESTING_DEPTH = 100
# Parameters Triton reads as bools; any other type is refused, as Triton refuses it.
_BOOL_PARAMETERS = frozenset({"binary_data", "binary_data_output"})


def load_object(raw: bytes) -> dict[str, Any]:
    """The JSON object ``raw`` holds; InvalidInput for anything else."""
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if b"NaN" not in raw and b"Infinity" not in raw:
            raise InvalidInput(f"request body is not valid JSON: {exc}") from None
        header = _load_json_non_finite(raw, exc)
    if not isinstance(header, dict):
        raise InvalidInput("request body must be a JSON object")
    return header


def _load_json_non_finite(raw: bytes, first: orjson.JSONDecodeError) -> Any:
    """JSON with Triton's NaN, Infinity and -Infinity tokens, otherwise as strict as orjson."""
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_constant, parse_float=_finite_float)
        _check_strings(value)
    except (UnicodeError, ValueError, RecursionError):
        raise InvalidInput(f"request body is not valid JSON: {first}") from None
    return value


def _constant(token: str) -> float:
    return float(token)  # NaN, Infinity, -Infinity


def _finite_float(token: str) -> float:
    value = float(token)
    if math.isinf(value):  # 1e999: out of range, as orjson and Triton say
        raise ValueError(f"number out of range: {token}")
    return value


def _check_strings(value: Any) -> None:
    """Reject what orjson would: strings with lone surrogates (not encodable as UTF-8)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            item.encode("utf-8")
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())


def check_parameter(where: str, key: str, value: Any) -> None:
    """A parameter is a string, a number or a bool (KServe v2); Triton's bools are bools."""
    if key in _BOOL_PARAMETERS and not isinstance(value, bool):
        raise InvalidInput(f"{where} parameter '{key[:64]}' must be a bool, got {_kind(value)}")
    if not isinstance(value, str | int | float):
        raise InvalidInput(
            f"{where} parameter '{key[:64]}' has invalid type ({_kind(value)}); "
            "a parameter is a string, a number or a bool"
        )


def _kind(value: Any) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)


_JSON_KINDS: dict[type, str] = {
    dict: "an object",
    list: "a list",
    type(None): "null",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a bool",
}


def flatten(name: str, data: Any, limit: int | None = None) -> tuple[list[Any], set[type]]:
    """Row-major elements of nested lists, and their types.

    Regular nesting is unwound a level at a time in C; ragged nesting falls back to an
    iterative walk: no recursion, and no element deeper than Triton's limit. A level of more
    than ``limit`` items is returned as it is, typed by its first item (``list`` when it is
    one: not flattened): each item holds an element, so the data holds more than ``limit``,
    and nothing is built for it.
    """
    if not isinstance(data, list):
        return [data], {type(data)}
    level = 1  # of the elements of ``data``
    while True:
        if data and level >= TRITON_MAX_JSON_NESTING_DEPTH:
            raise _too_deep(name)
        if limit is not None and len(data) > limit:
            return data, {type(data[0])}
        types = set(map(type, data))
        if list not in types:
            return data, types
        if types != {list}:
            flat = _flatten_ragged(name, data, level)
            return flat, set(map(type, flat))
        data = list(itertools.chain.from_iterable(data))
        level += 1


def _flatten_ragged(name: str, data: list[Any], level: int) -> list[Any]:
    flat: list[Any] = []
    stack = [iter(data)]  # the elements of stack[i] are at level + i
    while stack:
        for element in stack[-1]:
            if isinstance(element, list):
                if element and level + len(stack) >= TRITON_MAX_JSON_NESTING_DEPTH:
                    raise _too_deep(name)
                stack.append(iter(element))
                break
            flat.append(element)
        else:
            stack.pop()
    return flat


def _too_deep(name: str) -> InvalidInput:
    return InvalidInput(  # Triton's words
        f"input '{name}': JSON nesting depth of 'data' exceeds maximum allowed limit "
        f"({TRITON_MAX_JSON_NESTING_DEPTH})"
    )
