"""What the live workers serve, read from their heartbeat values.

A worker's heartbeat value is msgpack ``[[model, version, instances], ...]``.
"""

from __future__ import annotations

import msgpack


def encode_served(served: list[tuple[str, str, int]]) -> bytes:
    return msgpack.packb([list(item) for item in served])


def served_instances(live: dict[str, bytes]) -> dict[tuple[str, str], int]:
    """Instances per (model, version), summed over the live workers."""
    totals: dict[tuple[str, str], int] = {}
    for value in live.values():
        for model, version, instances in msgpack.unpackb(value):
            key = (str(model), str(version))
            totals[key] = totals.get(key, 0) + int(instances)
    return totals
