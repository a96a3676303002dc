"""Triton's model control modes (kept apart so that settings import nothing heavier)."""

from __future__ import annotations

from enum import StrEnum


class ControlMode(StrEnum):
    """Triton's ``--model-control-mode``."""

    NONE = "none"
    EXPLICIT = "explicit"
    POLL = "poll"
