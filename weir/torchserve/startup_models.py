"""The archives served at start: ``load_models`` in ``config.properties``, or ``--models``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StartupModel:
    """One ``load_models`` entry: ``name=file.mar`` or ``file.mar``."""

    url: str
    name: str | None = None


def load_models(value: str) -> list[StartupModel] | Literal["all"]:
    """``load_models`` (or ``--models``, joined by commas, as TorchServe's frontend joins it).

    Raises:
        ValueError: An item is neither ``name=file.mar`` nor ``file.mar``.
    """
    text = value.strip()
    if text.lower() == "all":
        return "all"
    if text.lower() == "standalone":
        return []
    return [_startup_model(item.strip()) for item in text.split(",") if item.strip()]


def _startup_model(item: str) -> StartupModel:
    name, separator, url = item.partition("=")
    if not separator:
        return StartupModel(url=item)
    if not name.strip() or not url.strip():
        raise ValueError(f"{item!r} is neither name=file.mar nor file.mar")
    return StartupModel(url=url.strip(), name=name.strip())
