"""Every hash whose key matches a pattern, read in one round trip after the scan.

The gateway's metrics read what the workers publish this way (GPU samples, handler metrics):
hashes with a TTL, one per GPU or worker, that come and go with them.
"""

from __future__ import annotations

import redis


def hashes_matching(client: redis.Redis, pattern: str) -> list[dict[bytes, bytes]]:
    """The non-empty hashes whose keys match ``pattern`` now (on a cluster: every primary's)."""
    keys = list(client.scan_iter(match=pattern, count=100))
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    return [raw for raw in pipe.execute() if raw]
