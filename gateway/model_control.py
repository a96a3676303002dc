"""Triton's model repository extension, shared by HTTP and gRPC: index, load, unload.

Loads and unloads are allowed in mode explicit only, as Triton allows them; each writes the
desired state (:class:`~weir.control.controller.Controller`) and then waits until the mesh
serves the change: a load answers once a live worker serves every version with the new
config and files (or a worker reports why it cannot: the change is then undone and the
reason kept for the index), an unload once no worker serves the model any more. Weir adds
traffic weights, changed with :func:`set_weights`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

from redis.exceptions import RedisError

from gateway.control import ControlLoop
from gateway.state import GatewayState
from weir import names
from weir.control import uploads
from weir.control.desired import DesiredModel, DesiredState
from weir.control.mode import ControlMode
from weir.errors import ConfigError, InvalidInput, Unavailable
from weir.liveness import live_consumers
from weir.repository import ModelEntry, model_dirs
from weir.workload import MeshView, mesh_view

NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"


async def index(state: GatewayState, ready_only: bool = False) -> list[dict[str, str]]:
    """Every model of the repository and every model served, with its state and reason.

    Read from what the live workers serve now, as readiness is: the control loop's view
    may be a refresh old, and the index must not say LOADING once the server says ready.
    """
    control = _loop(state)
    catalog = state.catalog
    view = await _live_view(state)
    listed: list[dict[str, str]] = []
    on_disk = {d.name for d in model_dirs(catalog.root)}
    for name in sorted(on_disk | set(catalog.models) | set(catalog.reasons)):
        entry = catalog.models.get(name)
        if entry is None:
            reason = catalog.reasons.get(name, "not loaded")
            listed.append({"name": name, "state": "UNAVAILABLE", "reason": reason})
            continue
        listed.extend(_versions(state, control, view, entry))
    return [m for m in listed if m.get("state") == "READY"] if ready_only else listed


async def _live_view(state: GatewayState) -> MeshView:
    try:
        return mesh_view(await live_consumers(state.redis, names.WORKER_GROUP))
    except RedisError as exc:
        raise Unavailable(f"Redis is unreachable: {exc}") from None


def _versions(
    state: GatewayState, control: ControlLoop, view: MeshView, entry: ModelEntry
) -> list[dict[str, str]]:
    rows = []
    for version in entry.versions:
        stamp = entry.stamp(version)
        failure = view.failure(entry.name, version, entry.failure_stamp(version))
        if _served(state, view, entry, version, stamp):
            row = {"state": "READY", "reason": ""}
        elif failure:
            row = {"state": "UNAVAILABLE", "reason": failure}
        elif control.mode is ControlMode.NONE:
            row = {"state": "UNAVAILABLE", "reason": "no live worker serves it"}
        else:
            row = {"state": "LOADING", "reason": ""}
        rows.append({"name": entry.name, "version": version, **row})
    for version in sorted(state.catalog.earlier.get(entry.name, set()) - set(entry.versions)):
        rows.append({"name": entry.name, "version": version, "state": "UNLOADING", "reason": ""})
    return rows


def _served(
    state: GatewayState, view: MeshView, entry: ModelEntry, version: str, stamp: str
) -> bool:
    if entry.config.is_ensemble:
        steps = state.catalog.pipelines[entry.name].steps
        return all(view.serves(s.model, s.version) for s in steps)
    return view.serves(entry.name, version, stamp)


async def load(state: GatewayState, name: str, parameters: dict[str, Any]) -> None:
    """Load or reload ``name``; returns once the mesh serves it (WeirError otherwise)."""
    control = _explicit(state)
    override = _config_override(parameters)
    files = _files(name, parameters, state.settings.model_upload_limit_bytes)
    before = control.state
    try:
        if files:
            desired = await _load_files(control, name, override, files)
        else:
            retry = await _failed_before(state, name)
            desired = await control.controller.load(name, override, retry=retry)
    except ConfigError as exc:
        await control.follower.check()  # the reason it recorded, for this gateway's index
        raise InvalidInput(f"failed to load '{name}': {exc}") from None
    await control.follower.check()
    loaded = [m for n, m in desired.models.items() if _changed(before, m)] or [desired.models[name]]
    await _wait_loaded(state, control, name, loaded, before)
    state.readiness.forget()  # the probes that follow see what the load just saw


async def _failed_before(state: GatewayState, name: str) -> bool:
    """Whether a worker failed to load ``name`` as it is: a load asked again retries it."""
    entry = state.catalog.models.get(name)
    if entry is None:
        return False
    view = await _live_view(state)
    return any(view.failure(name, v, entry.failure_stamp(v)) for v in entry.versions)


def _changed(before: DesiredState, model: DesiredModel) -> bool:
    return not model.same_as(before.models.get(model.name))


async def _wait_loaded(
    state: GatewayState,
    control: ControlLoop,
    name: str,
    models: list[DesiredModel],
    before: DesiredState,
) -> None:
    deadline = time.monotonic() + state.settings.model_load_timeout_s
    while True:
        view = state.catalog.view
        for model in models:
            for version in model.versions:
                failure = view.failure(model.name, version, model.failure_stamp(version))
                if failure:
                    await _undo(control, models, before, failure)
                    raise InvalidInput(f"failed to load '{name}': {failure}")
        pending = [
            m
            for m in models
            if m.config.get("backend") != "ensemble"
            and not all(view.serves(m.name, v, m.stamps[v]) for v in m.versions)
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise Unavailable(
                f"failed to load '{name}': not served within "
                f"{state.settings.model_load_timeout_s:g} s (is a worker of its pool running?)"
            )
        await control.next_round(state.settings.control_refresh_s * 2)


async def _undo(
    control: ControlLoop, models: list[DesiredModel], before: DesiredState, reason: str
) -> None:
    """Back to what served before the load, keeping why it failed for the index."""

    def change(current: DesiredState) -> DesiredState:
        for model in models:
            old = before.models.get(model.name)
            if old is not None:
                current = current.with_model(old)
            elif model.name in current.models:
                current = current.without_model(model.name, "")
            current = current.with_reason(model.name, f"load failed: {reason}")
        return current

    await control.controller.update(change)
    await control.follower.check()


async def unload(state: GatewayState, name: str, parameters: dict[str, Any]) -> None:
    """Stop serving ``name``; returns once no worker serves it (or the load timeout)."""
    control = _explicit(state)
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidInput("parameter 'unload_dependents' must be a boolean")
    before = control.state
    desired = await control.controller.unload(name, dependents)
    await control.follower.check()
    gone = [m for n, m in before.models.items() if n not in desired.models]
    deadline = time.monotonic() + state.settings.model_load_timeout_s
    while time.monotonic() < deadline:
        view = state.catalog.view
        if not any(view.serves(m.name, v) for m in gone for v in m.versions):
            state.readiness.forget()
            return
        await control.next_round(state.settings.control_refresh_s * 2)


async def set_weights(state: GatewayState, name: str, weights: Any) -> None:
    """Weir's traffic split: ``{"1": 80, "2": 20}``; ``{}`` routes to the newest again."""
    control = _explicit(state, allow_poll=True)
    if not isinstance(weights, dict) or not all(
        isinstance(w, int) and not isinstance(w, bool) for w in weights.values()
    ):
        raise InvalidInput("weights must map version names to whole numbers")
    try:
        await control.controller.set_weights(name, {str(k): w for k, w in weights.items()})
    except ConfigError as exc:
        raise InvalidInput(str(exc)) from None
    await control.follower.check()


def _loop(state: GatewayState) -> ControlLoop:
    if state.control is None:
        raise Unavailable("model control is not running")
    return state.control


def _explicit(state: GatewayState, allow_poll: bool = False) -> ControlLoop:
    control = _loop(state)
    allowed = {ControlMode.EXPLICIT, ControlMode.POLL} if allow_poll else {ControlMode.EXPLICIT}
    if control.mode not in allowed:
        raise Unavailable(NOT_ALLOWED)
    return control


def _files(name: str, parameters: dict[str, Any], limit_bytes: int) -> dict[str, bytes]:
    """The model files a load carries (``file:<path>``: base64 over HTTP, bytes over gRPC)."""
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if not key.startswith(uploads.FILE_PARAMETER):
            continue
        if isinstance(value, str):
            try:
                value = base64.b64decode(value, validate=True)
            except ValueError:
                raise InvalidInput(f"failed to load '{name}': '{key}' is not base64") from None
        if not isinstance(value, bytes):
            raise InvalidInput(f"failed to load '{name}': '{key}' must be the file's bytes")
        files[key.removeprefix(uploads.FILE_PARAMETER)] = value
    if files:
        if "config" not in parameters:
            raise InvalidInput(
                f"failed to load '{name}': the model config ('config') must come with its files"
            )
        try:
            uploads.check_files(name, files, limit_bytes)
        except ValueError as exc:
            raise InvalidInput(f"failed to load '{name}': {exc}") from None
    return files


async def _load_files(
    control: ControlLoop, name: str, override: dict[str, Any] | None, files: dict[str, bytes]
) -> DesiredState:
    """Keep the files in Redis for every host, write them here, resolve them here."""
    digest = uploads.digest_of(name, json.dumps(override, sort_keys=True).encode(), files)
    local = await asyncio.to_thread(uploads.write_tree, control.uploads_dir, digest, name, files)
    await uploads.store(control.redis, digest, files)
    stored = uploads.UPLOAD_PREFIX + digest
    try:
        return await control.controller.load(name, override, local.parent, stored)
    except ConfigError:
        await control.redis.delete(names.uploaded_files(digest))
        raise


def _config_override(parameters: dict[str, Any]) -> dict[str, Any] | None:
    raw = parameters.get("config")
    if raw is None:
        return None
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise InvalidInput("parameter 'config' must be the model config as a JSON string")
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise InvalidInput(f"parameter 'config' is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InvalidInput("parameter 'config' must be a JSON object")
    return config
