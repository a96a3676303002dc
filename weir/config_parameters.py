"""A model config's ``parameters``: Triton's shape flattened, and the ones Weir reads itself."""

from __future__ import annotations

from typing import Any

# The most bytes of input one request may carry (413 past it), so one huge request cannot
# hold an instance that others wait for.
MAX_INPUT_BYTES = "max_input_bytes"


def flatten_parameters(raw: dict[str, Any]) -> dict[str, str]:
    """Parameters as plain strings, from Triton's ``{key: {string_value: ...}}`` or plain."""
    if not isinstance(raw, dict):
        raise ValueError("parameters must be a mapping of names to values")
    flat: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(value, dict) and "string_value" in value:
            value = value["string_value"]
        flat[str(key)] = str(value)
    return flat


def check_max_input_bytes(raw: str | None) -> None:
    """Refuse a ``max_input_bytes`` that is no whole number of bytes above 0."""
    if raw is not None and not (raw.strip().isdigit() and int(raw) > 0):
        raise ValueError(f"parameter {MAX_INPUT_BYTES} must be a whole number of bytes > 0")
