"""A model config's ``parameters``: Triton's shape flattened, and the ones Weir reads itself."""

from __future__ import annotations

from typing import Any

# The most bytes of input one request may carry (413 past it), so one huge request cannot
# hold an instance that others wait for.
MAX_INPUT_BYTES = "max_input_bytes"
# The longest one batch may run on an instance (TorchServe's responseTimeout): past it the
# batch's requests are answered with an error and the worker exits, for a fresh one.
RESPONSE_TIMEOUT_S = "response_timeout_s"
# The longest loading a version's instances (and warming them up) may take (TorchServe's
# startupTimeout): past it the load is reported failed and the worker exits, for a fresh one.
LOAD_TIMEOUT_S = "load_timeout_s"


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


def check_seconds(name: str, raw: str | None) -> None:
    """Refuse a parameter ``name`` that is no number of seconds above 0."""
    if raw is None:
        return
    try:
        seconds = float(raw)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"parameter {name} must be a number of seconds > 0")


def check_parameters(parameters: dict[str, str]) -> None:
    """Refuse a value Weir cannot read in the parameters it reads itself."""
    check_max_input_bytes(parameters.get(MAX_INPUT_BYTES))
    for name in (RESPONSE_TIMEOUT_S, LOAD_TIMEOUT_S):
        check_seconds(name, parameters.get(name))


def seconds_or_none(parameters: dict[str, str], name: str) -> float | None:
    """A checked parameter's seconds; None when it is not set."""
    raw = parameters.get(name)
    return None if raw is None else float(raw)
