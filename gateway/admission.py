"""Admission: queue a request, or refuse it at once when its model's queue is full.

One Lua script, one round trip: it checks the model's queued-request counter against
``max_queue_size`` (Triton's ``default_queue_policy``), and if there is room it adds the
request to the model's request stream and counts it. The counter and the stream share the
model's hash tag, so the script runs on one Redis Cluster slot. Workers and the batcher
decrement the counter in the transactions that answer requests.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.typing import EncodableT

from weir import names

# KEYS: counter, stream. ARGV: max_queue_size (0: unbounded), then the entry's field/values.
_ADMIT = """
local limit = tonumber(ARGV[1])
if limit > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') >= limit then
  return -1
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
return redis.call('INCR', KEYS[1])
"""


class Admission:
    """Queues requests on their model's stream, bounded by the model's queue policy."""

    def __init__(self, redis: Redis) -> None:
        self.script = redis.register_script(_ADMIT)

    async def enqueue(
        self, model: str, version: str, fields: dict[bytes, bytes], max_queue_size: int
    ) -> bool:
        """Queue the entry; False when the queue already holds ``max_queue_size`` requests."""
        args: list[EncodableT] = [max_queue_size]
        for key, value in fields.items():
            args.extend((key, value))
        keys = [names.queued_counter(model, version), names.request_stream(model, version)]
        queued = await self.script(keys=keys, args=args)
        return int(queued) >= 0
