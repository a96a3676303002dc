"""Triton's logging extension: the whole mesh's log settings, changed while it runs.

``GET``/``POST /v2/logging`` and gRPC ``LogSettings`` read and change Triton's settings:
``log_info``, ``log_warning`` and ``log_error`` (booleans: whether records of that level are
written), ``log_verbose_level`` (0: no verbose records; 1 or more: Python's DEBUG records
too) and ``log_format`` (``default``, or ``ISO8601`` timestamps); ``log_file`` is read-only
(``""``: the console), as in Triton. Triton's own documentation spells two of them
``log_warnings`` and ``log_errors``; a change by either name is taken.

A change is written to one Redis hash (:data:`weir.names.LOG_SETTINGS`), and every service
of the mesh (gateways, batchers, workers) reads it every ``WEIR_LOG_SETTINGS_REFRESH_S``
and applies it to its own logging: a verbose level set once reaches every worker. Until
anything is set, each service logs by its own ``WEIR_LOG_LEVEL``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.typing import EncodableT, FieldT

from weir import names
from weir.errors import InvalidInput, Unsupported

logger = logging.getLogger(__name__)

FORMATS = ("default", "ISO8601")
ISO8601_DATEFMT = "%Y-%m-%dT%H:%M:%S"
ALIASES = {"log_warnings": "log_warning", "log_errors": "log_error"}  # Triton's docs' names
FLAGS = ("log_info", "log_warning", "log_error")
LOG_FILE_FIXED = "log file location can not be updated through network protocol"


@dataclass(frozen=True)
class LogSettings:
    """Triton's log settings, by its names."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def of_level(cls, level: str) -> LogSettings:
        """The settings a service's ``WEIR_LOG_LEVEL`` amounts to."""
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            number = logging.INFO
        return cls(
            log_info=number <= logging.INFO,
            log_warning=number <= logging.WARNING,
            log_error=number <= logging.ERROR,
            log_verbose_level=1 if number <= logging.DEBUG else 0,
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def changed(self, update: Mapping[str, Any]) -> LogSettings:
        """These settings with ``update``'s (a client's); InvalidInput or Unsupported."""
        values: dict[str, Any] = {}
        for raw_name, value in update.items():
            name = ALIASES.get(raw_name, raw_name)
            if value is None:
                continue  # as Triton: a null leaves the setting as it is
            values[name] = _checked(name, value)
        return replace(self, **values)

    def encode(self) -> dict[FieldT, EncodableT]:
        """The Redis hash's fields."""
        fields = asdict(self).items()
        return {k: str(int(v)) if isinstance(v, bool) else str(v) for k, v in fields}

    @classmethod
    def decode(cls, fields: Mapping[bytes | str, bytes | str], base: LogSettings) -> LogSettings:
        """The hash's settings over ``base`` (fields it lacks keep ``base``'s)."""
        text = {_text(k): _text(v) for k, v in fields.items()}
        values: dict[str, Any] = {}
        for name in FLAGS:
            if name in text:
                values[name] = text[name] == "1"
        if text.get("log_verbose_level", "").isdigit():
            values["log_verbose_level"] = int(text["log_verbose_level"])
        if text.get("log_format") in FORMATS:
            values["log_format"] = text["log_format"]
        return replace(base, **values)


def _checked(name: str, value: Any) -> Any:
    if name == "log_file":
        raise Unsupported(LOG_FILE_FIXED)
    if name in FLAGS:
        if not isinstance(value, bool):
            raise InvalidInput(f"expect boolean for '{name}'")
        return value
    if name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
            raise InvalidInput(f"expect unsigned integer for '{name}'")
        return value
    if name == "log_format":
        if value not in FORMATS:
            raise InvalidInput(f"invalid argument for --log_format, got: {value}")
        return value
    raise InvalidInput(
        f"unknown log setting '{name}'; the settings are log_file, {', '.join(FLAGS)}, "
        "log_verbose_level and log_format"
    )


# Loggers with handlers of their own that do not pass records to the root's (the gateway's
# HTTP server's): they follow the settings too.
OWN_HANDLERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def _handlers(root: logging.Logger) -> list[logging.Handler]:
    handlers = list(root.handlers)
    for name in OWN_HANDLERS:
        handlers += logging.getLogger(name).handlers
    return handlers


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _ByLevel(logging.Filter):
    """Passes a record when its level's setting is on."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self.settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0


class LogControl:
    """Applies the mesh's log settings to this process's logging, as they change."""

    def __init__(self, redis: Redis, log_level: str, refresh_s: float) -> None:
        self.redis = redis
        self.default = default = LogSettings.of_level(log_level)  # WEIR_LOG_LEVEL's
        self.refresh_s = refresh_s
        self.current = default
        self._filter = _ByLevel(default)
        self._updates = 0  # changes made here: a read begun before one is stale

    async def read(self) -> LogSettings:
        """The mesh's settings (this service's own where none were set)."""
        return LogSettings.decode(await self.redis.hgetall(names.LOG_SETTINGS), self.default)

    async def update(self, change: Mapping[str, Any]) -> LogSettings:
        """Check ``change``, write it for the whole mesh, apply it here; the settings now."""
        settings = (await self.read()).changed(change)
        self._updates += 1  # before and after the write: a read that overlaps it is stale
        await self.redis.hset(names.LOG_SETTINGS, mapping=settings.encode())
        self._updates += 1
        self.apply(settings)
        return settings

    def apply(self, settings: LogSettings) -> None:
        """Make this process log by ``settings``."""
        root = logging.getLogger()
        for handler in _handlers(root):
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)
            if handler.formatter is not None:
                iso = settings.log_format == "ISO8601"
                handler.formatter.datefmt = ISO8601_DATEFMT if iso else None
        self._filter.settings = settings
        root.setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)
        if settings != self.current:
            logger.info("log settings now %s", settings.as_json())
        self.current = settings

    async def run(self) -> None:
        """Follow the mesh's settings until cancelled."""
        while True:
            updates = self._updates
            try:
                settings = await self.read()
            except RedisError as exc:
                logger.debug("log settings unread: %s", exc)
            else:
                if settings != self.current and updates == self._updates:
                    self.apply(settings)
            await asyncio.sleep(self.refresh_s)
