"""Triton's trace extension: sampled requests' timestamps (and tensors) written to a file.

A gateway started with a trace file (``--trace-config triton,file=PATH``, or
``WEIR_GATEWAY_TRACE_FILE``) traces one request in every ``trace_rate`` of each model while
``trace_level`` is ``TIMESTAMPS`` (or ``TENSORS``, which adds each input and output), at most
``trace_count`` of them (-1: no limit). A trace is Triton's JSON: the request's model and
version, then its timestamps, the mesh's own stamps under Triton's names
(``REQUEST_START`` and ``QUEUE_START`` when the gateway took it, ``COMPUTE_START``,
``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START`` and ``COMPUTE_END`` in the worker,
``REQUEST_END`` when its answer came back), in unix nanoseconds. With ``log_frequency`` N
the traces are written every N to ``PATH.0``, ``PATH.1``...; with 0, all at once to
``PATH`` when the gateway stops, as Triton does.

``GET``/``POST /v2/trace/setting`` (a model's: ``/v2/models/{m}/trace/setting``) and gRPC
``TraceSetting`` read and change the settings, which live in Redis: every gateway of the
mesh follows them (every ``WEIR_LOG_SETTINGS_REFRESH_S``). A model's settings override the
global ones field by field; a null value removes a model's own, and a model's request with
no settings removes them all. ``trace_file`` is read-only, as in Triton's later versions.
Each gateway process samples, counts and writes on its own: with several, each writes its
own file, the path followed by ``.p<pid>``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names
from weir.errors import InvalidInput, Unsupported
from weir.stats import Stamp
from weir.tensors import Tensor

logger = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
GLOBAL = ""  # the hash field of the global settings; a model's is its name
STAMP_NAMES = (
    ("REQUEST_START", Stamp.GATEWAY_IN),
    ("QUEUE_START", Stamp.GATEWAY_IN),
    ("COMPUTE_START", Stamp.COMPUTE_START),
    ("COMPUTE_INPUT_END", Stamp.COMPUTE_INPUT_END),
    ("COMPUTE_OUTPUT_START", Stamp.COMPUTE_INFER_END),
    ("COMPUTE_END", Stamp.COMPUTE_END),
    ("REQUEST_END", Stamp.GATEWAY_OUT),
)
SHOWN_ELEMENTS = 1024  # of a traced tensor; the rest is left out


@dataclass(frozen=True)
class TraceSettings:
    """Triton's trace settings, by its names."""

    trace_file: str = ""
    trace_level: tuple[str, ...] = ("OFF",)
    trace_rate: int = 1000
    trace_count: int = -1
    log_frequency: int = 0

    def as_json(self) -> dict[str, Any]:
        """Triton's form: strings, and a list of them for the level."""
        return {
            "trace_file": self.trace_file,
            "trace_level": list(self.trace_level),
            "trace_rate": str(self.trace_rate),
            "trace_count": str(self.trace_count),
            "log_frequency": str(self.log_frequency),
        }

    @property
    def on(self) -> bool:
        return bool(self.trace_file) and "OFF" not in self.trace_level and self.trace_count != 0

    def changed(self, values: Mapping[str, Any]) -> TraceSettings:
        """These settings with ``values`` (checked, Triton's names) applied."""
        return replace(self, **{name: _checked(name, value) for name, value in values.items()})


def _checked(name: str, value: Any) -> Any:
    """A client's value for setting ``name``; InvalidInput or Unsupported."""
    if name == "trace_file":
        raise Unsupported("trace file location can not be updated through network protocol")
    if name == "trace_level":
        levels = tuple(value) if isinstance(value, list) else (value,)
        if not levels or any(level not in LEVELS for level in levels):
            raise InvalidInput(f"trace_level must be a list of {', '.join(LEVELS)}, got {value!r}")
        return levels
    if name in ("trace_rate", "trace_count", "log_frequency"):
        text = value[0] if isinstance(value, list) and len(value) == 1 else value
        lowest = -1 if name == "trace_count" else (1 if name == "trace_rate" else 0)
        try:
            number = int(text)
        except (TypeError, ValueError):
            number = lowest - 1
        if isinstance(text, bool) or number < lowest:
            raise InvalidInput(f"{name} must be an integer of at least {lowest}, got {value!r}")
        return number
    known = ", ".join(f.name for f in fields(TraceSettings))
    raise InvalidInput(f"unknown trace setting '{name}'; the settings are {known}")


def _reading(text: bytes | str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Tracer:
    """This gateway process's traces: the mesh's settings, sampling, the file."""

    def __init__(self, redis: Redis, base: TraceSettings, processes: int, refresh_s: float):
        self.redis = redis
        self.base = base  # the gateway's own settings, before any change through the API
        self.refresh_s = refresh_s
        suffix = f".p{os.getpid()}" if processes > 1 else ""
        self.path = base.trace_file + suffix if base.trace_file else ""
        self.global_ = base
        self.overrides: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, int] = {}
        self._traced: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._kept: list[dict[str, Any]] = []
        self._files = itertools.count()
        self._updates = 0

    def settings(self, model: str | None) -> TraceSettings:
        """The settings in force for ``model`` (the global ones for None)."""
        if model is None or model not in self.overrides:
            return self.global_
        return replace(self.global_, **_stored(self.overrides[model]))

    def sample(self, model: str) -> bool:
        """Whether this request of ``model`` is traced (one in ``trace_rate``)."""
        if not self.path:
            return False  # no trace file: nothing is ever traced, at the cost of one test
        settings = self.settings(model)
        if not settings.on:
            return False
        seen = self._seen[model] = self._seen.get(model, 0) + 1
        if seen % settings.trace_rate:
            return False
        traced = self._traced.get(model, 0)
        if 0 <= settings.trace_count <= traced:
            return False
        self._traced[model] = traced + 1
        return True

    def record(
        self,
        model: str,
        version: str,
        request_id: str | None,
        stamps: Mapping[str, int],
        tensors: tuple[Mapping[str, Tensor], Mapping[str, Tensor]] | None = None,
    ) -> None:
        """Keep one traced request; write the file when ``log_frequency`` traces are kept."""
        trace_id = next(self._ids)
        number = int(version) if version.isdigit() else version
        self._kept.append({"id": trace_id, "model_name": model, "model_version": number})
        timestamps = [{"name": n, "ns": stamps[s]} for n, s in STAMP_NAMES if s in stamps]
        entry: dict[str, Any] = {"id": trace_id, "timestamps": timestamps}
        if request_id:
            entry["request_id"] = request_id
        self._kept.append(entry)
        if tensors is not None and "TENSORS" in self.settings(model).trace_level:
            self._kept += _tensors(trace_id, "TENSOR_QUEUE_INPUT", tensors[0])
            self._kept += _tensors(trace_id, "TENSOR_BACKEND_OUTPUT", tensors[1])
        frequency = self.settings(model).log_frequency
        if frequency and sum("timestamps" in e for e in self._kept) >= frequency:
            self._write(f"{self.path}.{next(self._files)}")

    def close(self) -> None:
        """Write what is kept (at the gateway's end: all of it, with log_frequency 0)."""
        if self._kept and self.path:
            frequency = self.global_.log_frequency
            self._write(f"{self.path}.{next(self._files)}" if frequency else self.path)

    def _write(self, path: str) -> None:
        kept, self._kept = self._kept, []
        try:
            Path(path).write_text(json.dumps(kept, indent=1))
        except OSError as exc:
            logger.error("traces not written to %s: %s", path, exc)

    async def update(self, model: str | None, change: Mapping[str, Any]) -> TraceSettings:
        """Check ``change``, write it for the whole mesh, follow it here; the settings now."""
        await self.refresh()
        if model is None:
            field, stored = GLOBAL, _stored_of(self.global_, self.base)
        else:  # Triton: a model's request with no settings removes its own
            field, stored = model, dict(self.overrides.get(model, {})) if change else {}
        for name, value in change.items():
            if value is None:
                stored.pop(name, None)
            else:
                checked = _checked(name, value)
                stored[name] = list(checked) if isinstance(checked, tuple) else checked
        self._updates += 1
        await self.redis.hset(names.TRACE_SETTINGS, field, json.dumps(stored))
        self._updates += 1
        self._take(field, stored)
        return self.settings(model)

    async def refresh(self) -> None:
        """Read the mesh's settings now."""
        updates = self._updates
        raw = await self.redis.hgetall(names.TRACE_SETTINGS)
        if updates != self._updates:
            return  # a change made here meanwhile is newer than this read
        read = {(k.decode() if isinstance(k, bytes) else k): _reading(v) for k, v in raw.items()}
        self._take(GLOBAL, read.pop(GLOBAL, {}))
        for model in set(self.overrides) - set(read):
            self._take(model, {})
        for model, stored in read.items():
            self._take(model, stored)

    def _take(self, field: str, stored: dict[str, Any]) -> None:
        """Follow one field's settings; a change starts its sampling and count afresh."""
        if field == GLOBAL:
            settings = replace(self.base, **_stored(stored))
            if settings != self.global_:
                self.global_ = settings
                self._seen.clear()
                self._traced.clear()
            return
        if stored == self.overrides.get(field, {}):
            return
        if stored:
            self.overrides[field] = stored
        else:
            self.overrides.pop(field, None)
        self._seen.pop(field, None)
        self._traced.pop(field, None)

    async def run(self) -> None:
        """Follow the mesh's settings until cancelled."""
        while True:
            try:
                await self.refresh()
            except RedisError as exc:
                logger.debug("trace settings unread: %s", exc)
            await asyncio.sleep(self.refresh_s)


def _stored(values: Mapping[str, Any]) -> dict[str, Any]:
    """Stored values as TraceSettings fields (anything unreadable left out)."""
    known = {f.name for f in fields(TraceSettings)} - {"trace_file"}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in known:
            try:
                checked = _checked(name, value)
            except (InvalidInput, Unsupported):
                continue
            out[name] = checked
    return out


def _stored_of(settings: TraceSettings, base: TraceSettings) -> dict[str, Any]:
    """The global settings' changes from the gateway's own, as stored."""
    out: dict[str, Any] = {}
    for field in fields(TraceSettings):
        value = getattr(settings, field.name)
        if field.name != "trace_file" and value != getattr(base, field.name):
            out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def _tensors(trace_id: int, activity: str, tensors: Mapping[str, Tensor]) -> list[dict[str, Any]]:
    out = []
    for name, tensor in tensors.items():
        values = tensor.to_numpy().ravel()[:SHOWN_ELEMENTS]
        data = ",".join(_shown(value) for value in values)
        shape = ",".join(map(str, tensor.shape))
        described = {"name": name, "data": data, "shape": shape, "dtype": tensor.datatype}
        out.append({"id": trace_id, "activity": activity, "tensor": described})
    return out


def _shown(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
