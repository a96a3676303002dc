"""The gateway's trace settings (``WEIR_GATEWAY_TRACE_*``): Triton's ``--trace-config``.

:class:`~weir.settings.GatewaySettings` has them; ``weir up`` and ``weir gateway`` take
Triton's flag (:func:`trace_options`). What they mean: :mod:`gateway.tracing`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from weir.errors import ConfigError

# Triton's --trace-config keys, as the settings' names.
TRACE_KEYS = {
    "file": "trace_file",
    "level": "trace_level",
    "rate": "trace_rate",
    "count": "trace_count",
    "log-frequency": "trace_log_frequency",
}


class TraceGatewaySettings(BaseSettings):
    """Where and how the gateway writes Triton's traces, until the trace API changes them."""

    trace_file: str = Field(
        "",
        description="where traces are written (Triton's --trace-config triton,file=); "
        "empty: no tracing",
    )
    trace_level: str = Field("OFF", pattern="^(OFF|TIMESTAMPS|TENSORS)$")
    trace_rate: int = Field(1000, ge=1, description="one request traced in this many")
    trace_count: int = Field(-1, ge=-1, description="traces at most; -1: no limit")
    trace_log_frequency: int = Field(
        0, ge=0, description="write every this many traces to FILE.N; 0: all at the end"
    )


def trace_options(flags: list[str]) -> dict[str, Any]:
    """Triton's ``--trace-config [triton,]KEY=VALUE`` flags as trace settings."""
    options: dict[str, Any] = {}
    for flag in flags:
        mode, _, setting = flag.partition(",") if "," in flag else ("", "", flag)
        if mode not in ("", "triton"):
            raise ConfigError(f"--trace-config {flag}: Weir writes Triton's traces (triton,...)")
        key, _, value = setting.partition("=")
        if key == "mode":
            if value != "triton":
                raise ConfigError(f"--trace-config {flag}: only mode=triton is served")
            continue
        if key not in TRACE_KEYS:
            known = ", ".join(TRACE_KEYS)
            raise ConfigError(f"--trace-config {flag}: unknown key {key!r} (known: {known})")
        options[TRACE_KEYS[key]] = value
    return options
