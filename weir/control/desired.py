"""The desired state: which models, versions and configs the mesh serves, in Redis.

One msgpack document under :func:`weir.names.desired_state`, and beside it its generation
number, which every service polls (one ``GET``) and reads the document only when it moved.
Writers change the document with a compare-and-set (``WATCH``), so two gateways loading at
once never lose each other's change; a change that changes nothing keeps the generation.

Each model carries its completed config (the JSON form :func:`weir.config.config_from_raw`
reads back, so no service but the one that resolved it reads the config file), its model
directory, the versions served, a stamp per version (its config and files: a new stamp is a
reload) and its traffic weights. ``reasons`` says why a model is not served (a failed load,
an unload) for the repository index.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import msgpack
from redis.asyncio import Redis
from redis.exceptions import WatchError

from weir import names
from weir.config import config_from_raw
from weir.repository import ModelEntry, Repository, attempt_stamp


@dataclass(frozen=True, slots=True)
class DesiredModel:
    """One model as the mesh should serve it."""

    name: str
    path: str
    config: Mapping[str, Any]
    versions: tuple[str, ...]
    stamps: Mapping[str, str]
    weights: Mapping[str, int] = field(default_factory=dict)
    attempt: int = 0  # raised by a load asked again of a model that failed to load

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "config": dict(self.config),
            "versions": list(self.versions),
            "stamps": dict(self.stamps),
            "weights": dict(self.weights),
            "attempt": self.attempt,
        }

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> DesiredModel:
        return cls(
            str(raw["name"]),
            str(raw["path"]),
            dict(raw["config"]),
            tuple(str(v) for v in raw["versions"]),
            {str(k): str(v) for k, v in raw["stamps"].items()},
            {str(k): int(v) for k, v in raw.get("weights", {}).items()},
            int(raw.get("attempt", 0)),
        )

    def failure_stamp(self, version: str) -> str:
        return attempt_stamp(self.stamps[version], self.attempt)

    def same_as(self, other: DesiredModel | None) -> bool:
        """True when serving ``other`` instead would change nothing (weights aside)."""
        return (
            other is not None
            and self.versions == other.versions
            and dict(self.stamps) == dict(other.stamps)
            and self.path == other.path
        )

    def entry(self) -> ModelEntry:
        """The repository entry, from the stored config (no file is read)."""
        path = Path(self.path)
        config = config_from_raw(dict(self.config), path, self.name)
        return ModelEntry(config, path, self.versions, dict(self.stamps), self.attempt)


@dataclass(frozen=True, slots=True)
class DesiredState:
    """Every model the mesh should serve, and why the others are not served."""

    generation: int = 0
    models: Mapping[str, DesiredModel] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        return cast(
            bytes,
            msgpack.packb(
                {
                    "generation": self.generation,
                    "models": [m.to_wire() for m in self.models.values()],
                    "reasons": dict(self.reasons),
                }
            ),
        )

    @classmethod
    def decode(cls, raw: bytes) -> DesiredState:
        doc = msgpack.unpackb(raw)
        models = [DesiredModel.from_wire(m) for m in doc["models"]]
        return cls(int(doc["generation"]), {m.name: m for m in models}, dict(doc["reasons"]))

    def with_model(self, model: DesiredModel) -> DesiredState:
        reasons = {k: v for k, v in self.reasons.items() if k != model.name}
        return replace(self, models={**self.models, model.name: model}, reasons=reasons)

    def without_model(self, name: str, reason: str) -> DesiredState:
        models = {k: v for k, v in self.models.items() if k != name}
        return replace(self, models=models, reasons={**self.reasons, name: reason})

    def with_reason(self, name: str, reason: str) -> DesiredState:
        return replace(self, reasons={**self.reasons, name: reason})

    def repository(self, root: Path) -> Repository:
        """The models to serve as a repository, each pipeline checked against its steps."""
        return Repository.of(root, {name: m.entry() for name, m in self.models.items()})


Change = Callable[[DesiredState], DesiredState]


def as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


class DesiredStore:
    """Reads and changes the desired state in Redis."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.key = names.desired_state()
        self.generation_key = names.desired_generation()

    async def generation(self) -> int | None:
        """The current generation; None when no desired state was ever written."""
        value = await self.redis.get(self.generation_key)
        return None if value is None else int(value)

    async def read(self) -> DesiredState | None:
        raw = await self.redis.get(self.key)
        return None if raw is None else DesiredState.decode(as_bytes(raw))

    async def update(self, change: Change) -> DesiredState:
        """Apply ``change`` atomically; the generation moves only when something changed."""
        while True:
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(self.key, self.generation_key)
                    raw = await pipe.get(self.key)
                    current = DesiredState() if raw is None else DesiredState.decode(as_bytes(raw))
                    changed = change(current)
                    if changed == current and raw is not None:
                        return current
                    new = replace(changed, generation=current.generation + 1)
                    cast(Any, pipe).multi()  # typed in some redis-py releases only
                    pipe.set(self.key, new.encode())
                    pipe.set(self.generation_key, new.generation)
                    await pipe.execute()
                    return new
                except WatchError:
                    continue
