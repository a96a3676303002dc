"""Every Redis key and stream name Weir uses, in one place.

Names that belong to one model carry the model in a hash tag (``{model}``) so that a Redis
Cluster keeps each model's streams on one slot.
"""

from __future__ import annotations

PREFIX = "weir"

BATCHER_GROUP = "batcher"
WORKER_GROUP = "workers"


def request_stream(model: str, version: str) -> str:
    """Requests for one (model, version), written by gateways, read by batchers."""
    return f"{PREFIX}:{{{model}}}:{version}:requests"


def batch_stream(model: str, version: str) -> str:
    """Formed batches for one (model, version), written by batchers, read by workers."""
    return f"{PREFIX}:{{{model}}}:{version}:batches"


def model_stats(model: str, version: str) -> str:
    """A hash of counters that workers record per executed batch."""
    return f"{PREFIX}:{{{model}}}:{version}:stats"


def reply_stream(gateway_id: str) -> str:
    """Replies for the requests that one gateway process took."""
    return f"{PREFIX}:reply:{gateway_id}"


def worker_heartbeat(pool: str, worker_id: str) -> str:
    """A key with a TTL that a live worker keeps refreshing."""
    return f"{PREFIX}:worker:{pool}:{worker_id}"


def worker_heartbeat_pattern() -> str:
    return f"{PREFIX}:worker:*"
