"""What the live workers serve, read from their heartbeat values.

A worker's heartbeat value is a msgpack map: ``served``, ``[[model, version, instances,
stamp], ...]`` (the stamp of the config and files each lane loaded; empty in mode none),
and ``failed``, ``[[model, version, stamp, reason], ...]`` for the loads that failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import msgpack

Lane = tuple[str, str]


def encode_served(
    served: Iterable[tuple[str, str, int, str]],
    failed: Iterable[tuple[str, str, str, str]] = (),
) -> bytes:
    report = {"served": [list(s) for s in served], "failed": [list(f) for f in failed]}
    return cast(bytes, msgpack.packb(report))


@dataclass(slots=True)
class MeshView:
    """What the live workers serve, summed over them."""

    instances: dict[Lane, int] = field(default_factory=dict)
    stamps: dict[Lane, set[str]] = field(default_factory=dict)
    failures: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def serves(self, model: str, version: str, stamp: str = "") -> bool:
        """True when a live worker runs an instance of the lane (with ``stamp``, if given)."""
        if self.instances.get((model, version), 0) <= 0:
            return False
        return not stamp or stamp in self.stamps.get((model, version), set())

    def failure(self, model: str, version: str, stamp: str) -> str | None:
        return self.failures.get((model, version, stamp))


def mesh_view(live: dict[str, bytes]) -> MeshView:
    view = MeshView()
    for value in live.values():
        report = msgpack.unpackb(value)
        for model, version, instances, stamp in report.get("served", ()):
            key = (str(model), str(version))
            view.instances[key] = view.instances.get(key, 0) + int(instances)
            view.stamps.setdefault(key, set()).add(str(stamp))
        for model, version, stamp, reason in report.get("failed", ()):
            view.failures[(str(model), str(version), str(stamp))] = str(reason)
    return view


def served_instances(live: dict[str, bytes]) -> dict[Lane, int]:
    """Instances per (model, version), summed over the live workers."""
    return mesh_view(live).instances
