"""Changing what the mesh serves: load, unload, traffic weights, the repository poller.

A gateway runs these for the repository extension's calls and, in mode poll, every
``repository_poll_secs``. Each change is one compare-and-set of the desired state
(:mod:`weir.control.desired`) plus the model's serving set, in this order: a version is
opened for admission before any gateway can route to it, and closed before the desired
state forgets it, so a request is never admitted to a lane that will not run it. A version
being replaced keeps admitting until its successors are served everywhere (:meth:`settle`),
so a swap fails no request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from weir import names
from weir.completion import Completion
from weir.control.desired import Change, DesiredModel, DesiredState, DesiredStore
from weir.control.resolve import check_weights, model_signature, resolve, steps_of
from weir.control.uploads import UPLOAD_PREFIX
from weir.errors import ConfigError
from weir.repository import model_dirs
from weir.workload import MeshView

logger = logging.getLogger(__name__)

UNLOADED = "unloaded"


class Controller:
    """Writes the desired state for one model repository."""

    def __init__(
        self,
        redis: Redis,
        root: Path,
        completion: Completion,
        settle_s: float,
    ) -> None:
        self.redis = redis
        self.store = DesiredStore(redis)
        self.root = root.resolve()
        self.completion = completion
        self.settle_s = settle_s  # how long successors are served before a version closes
        self.signatures: dict[str, str] = {}
        self.ready_since: dict[tuple[str, tuple[str, ...]], float] = {}
        self.settled_models: set[str] = set()  # the models of the state last settled

    async def load(
        self,
        name: str,
        override: dict[str, Any] | None = None,
        root: Path | None = None,
        stored_path: str = "",
        retry: bool = False,
    ) -> DesiredState:
        """Load (or reload) ``name`` and, for a pipeline, its steps, from the files.

        ``root``: where the model's directory is, when not in the repository (uploaded
        files), and ``stored_path`` what the desired state calls that directory; ``retry``:
        the workers try again the loads of it that failed. ConfigError, recorded as the
        model's reason, when it cannot be loaded; what served before goes on serving.
        """
        try:
            models = await asyncio.to_thread(self._resolve_tree, name, override, root)
        except ConfigError as exc:
            reason = f"load failed: {exc}"
            await self.update(lambda s: s.with_reason(name, reason))
            raise
        if stored_path:
            models[0] = replace(models[0], path=stored_path)
        await self._open(models)
        return await self.update(lambda s: self._put(s, models, retry))

    async def update(self, change: Change) -> DesiredState:
        """Change the desired state; drop the uploaded files no model uses any more."""
        used_before: set[str] = set()

        def tracked(state: DesiredState) -> DesiredState:
            used_before.clear()
            used_before.update(_uploads(state))
            return change(state)

        state = await self.store.update(tracked)
        unused = used_before - _uploads(state)
        if unused:
            await self.redis.delete(*(names.uploaded_files(d) for d in unused))
        return state

    def _resolve_tree(
        self, name: str, override: dict[str, Any] | None, root: Path | None
    ) -> list[DesiredModel]:
        first = resolve(root or self.root, name, self.completion, override)
        models = {name: first}
        pending = steps_of(first)
        while pending:
            step = pending.pop()
            if step not in models:
                models[step] = resolve(self.root, step, self.completion)
                pending.extend(steps_of(models[step]))
        return list(models.values())

    def _put(
        self, state: DesiredState, models: Iterable[DesiredModel], retry: bool = False
    ) -> DesiredState:
        # A load's failures are reported per attempt: a new one (this generation) for each
        # load that changes the model or retries it, so no worker's report of an earlier
        # failure is taken for this load's.
        attempt = state.generation + 1
        for model in models:
            old = state.models.get(model.name)
            if old is not None and model.same_as(old) and model.weights == {}:
                # An unchanged reload keeps the weights set by the API.
                model = replace(old, attempt=attempt) if retry else old
            else:
                if old is not None and not model.weights:
                    kept = {v: w for v, w in old.weights.items() if v in model.versions}
                    model = _with_weights(model, kept if any(kept.values()) else {})
                model = replace(model, attempt=attempt)
            state = state.with_model(model)
        state.repository(self.root)  # ConfigError for a pipeline its steps do not fit
        return state

    async def unload(self, name: str, unload_dependents: bool = False) -> DesiredState:
        """Stop serving ``name``; pipelines that use it stop with it.

        With ``unload_dependents``, a pipeline's steps stop too, unless another loaded
        pipeline uses them.
        """
        state = await self.store.read() or DesiredState()
        if name not in state.models:
            return await self.update(lambda s: s if name in s.reasons else _remove(s, ()))
        gone = _unload_set(state, name, unload_dependents)
        await self._close(state.models[n] for n in gone)
        return await self.update(lambda s: _remove(s, gone))

    async def set_weights(self, name: str, weights: dict[str, int]) -> DesiredState:
        """Split requests that name no version between served versions by ``weights``."""

        def change(state: DesiredState) -> DesiredState:
            model = state.models.get(name)
            if model is None:
                raise ConfigError(f"model '{name}' is not loaded")
            if weights:
                check_weights(weights, model.versions, name)
            return state.with_model(_with_weights(model, weights))

        return await self.update(change)

    async def poll_once(self) -> DesiredState:
        """Follow the repository's files: new, changed and removed models."""
        state = await self.store.read() or DesiredState()
        dirs = {d.name: d for d in await asyncio.to_thread(model_dirs, self.root)}
        signatures = await asyncio.to_thread(
            lambda: {n: model_signature(d) for n, d in dirs.items()}
        )
        changed = [n for n, sig in signatures.items() if self.signatures.get(n) != sig]
        loaded, failed = await asyncio.to_thread(self._resolve_many, changed, state)
        removed = [n for n in state.models if n not in dirs]
        await self._open(loaded)
        await self._close(state.models[n] for n in removed)

        def change(current: DesiredState) -> DesiredState:
            for model in loaded:
                if not model.same_as(current.models.get(model.name)):
                    current = current.with_model(model)
            for name, reason in failed.items():
                current = current.with_reason(name, f"load failed: {reason}")
            return _drop_broken_pipelines(_remove(current, removed), self.root)

        self.signatures = signatures  # a model that failed is tried again when it changes
        return await self.update(change)

    def _resolve_many(
        self, names_: list[str], state: DesiredState
    ) -> tuple[list[DesiredModel], dict[str, str]]:
        loaded, failed = [], {}
        for name in names_:
            try:
                model = resolve(self.root, name, self.completion)
            except ConfigError as exc:
                failed[name] = str(exc)
                logger.error("cannot load model %s: %s", name, exc)
                continue
            old = state.models.get(name)
            if old is not None and not model.weights:
                kept = {v: w for v, w in old.weights.items() if v in model.versions}
                model = _with_weights(model, kept if any(kept.values()) else {})
            loaded.append(model)
        return loaded, failed

    async def settle(self, state: DesiredState, view: MeshView) -> None:
        """Open what the desired state serves; close what it replaced, once settled.

        A replaced version closes once its successors have been served for ``settle_s``.
        A model the last settled state had and ``state`` has not is closed again: a round
        that settled a state read before an unload may have reopened it after the unload
        closed it, and nothing else would close it (its lanes could not retire until their
        timeout).
        """
        gone = self.settled_models - set(state.models)
        self.settled_models = set(state.models)
        if gone:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name in sorted(gone):  # one key per command: keys of a cluster's slots
                    pipe.delete(names.serving_versions(name))
                await pipe.execute()
        models = list(state.models.values())
        if not models:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.smembers(names.serving_versions(model.name))
            members = await pipe.execute()
        now = time.monotonic()
        for model, open_ in zip(models, members, strict=True):
            serving = {m.decode() if isinstance(m, bytes) else str(m) for m in open_}
            missing = set(model.versions) - serving
            if missing:
                await self.redis.sadd(names.serving_versions(model.name), *missing)
            extra = serving - set(model.versions)
            if extra and self._settled(model, view, now):
                logger.info("model %s: versions %s closed", model.name, ", ".join(sorted(extra)))
                await self.redis.srem(names.serving_versions(model.name), *extra)

    def _settled(self, model: DesiredModel, view: MeshView, now: float) -> bool:
        key = (model.name, model.versions)
        ready = all(view.serves(model.name, v, model.stamps[v]) for v in model.versions)
        if not ready:
            self.ready_since.pop(key, None)
            return False
        return now - self.ready_since.setdefault(key, now) >= self.settle_s

    async def _open(self, models: Iterable[DesiredModel]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.sadd(names.serving_versions(model.name), *model.versions)
            await pipe.execute()

    async def _close(self, models: Iterable[DesiredModel]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.delete(names.serving_versions(model.name))
            await pipe.execute()


def _uploads(state: DesiredState) -> set[str]:
    """The digests of the uploaded files the models of ``state`` are loaded from."""
    return {
        m.path.removeprefix(UPLOAD_PREFIX)
        for m in state.models.values()
        if m.path.startswith(UPLOAD_PREFIX)
    }


def _with_weights(model: DesiredModel, weights: dict[str, int]) -> DesiredModel:
    return replace(model, weights=weights)


def _unload_set(state: DesiredState, name: str, unload_dependents: bool) -> set[str]:
    """What unloading ``name`` stops: it, the pipelines using it, its steps if asked."""
    gone = {name}
    if unload_dependents:
        others = {s for n, m in state.models.items() if n != name for s in steps_of(m)}
        gone |= {s for s in steps_of(state.models[name]) if s not in others}
    users = {n for n, m in state.models.items() if gone.intersection(steps_of(m))}
    return gone | users


def _remove(state: DesiredState, gone: Iterable[str]) -> DesiredState:
    for name in gone:
        if name in state.models:
            state = state.without_model(name, UNLOADED)
    return state


def _drop_broken_pipelines(state: DesiredState, root: Path) -> DesiredState:
    """Pipelines whose steps are not all served stop, with the reason."""
    for name, model in list(state.models.items()):
        missing = [s for s in steps_of(model) if s not in state.models]
        if missing:
            reason = f"load failed: its step models are not loaded: {', '.join(missing)}"
            state = state.without_model(name, reason)
    state.repository(root)
    return state
