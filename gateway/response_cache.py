"""Triton's response cache: answers kept by their requests, in each gateway process.

A model whose config says ``response_cache { enable: true }`` has its answers kept when the
gateway has a cache (``WEIR_GATEWAY_RESPONSE_CACHE_BYTES``; Triton's ``--cache-config
local,size=N``, which ``weir up`` and ``weir gateway`` take too). A request identical to one
answered before is answered from the cache without entering the mesh: identical is the same
model and version, the same inputs (names, datatypes, shapes and bytes), the same requested
outputs and the same parameters for the model. The key is a 128-bit BLAKE2b digest of those
(Triton's is 64 bits). Once the kept bytes pass the size, the least recently used answers
leave first; an answer larger than the whole cache is not kept.

Only answers with outputs are kept, never errors, and never a decoupled model's (Triton
caches no stream). Classification and rendering apply to a kept answer as to a computed
one, so a request may ask for a kept output in another form. Each process keeps its own, as
Triton's ``local`` cache does in its one process.

Hits and misses are counted in the model's statistics (:class:`CacheCounts`, written to the
statistics hash with the workers' counters): Triton's ``cache_hit`` and ``cache_miss``, and
a hit is a ``success`` (no worker saw it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names
from weir.stats import Field
from weir.tensors import Tensor

logger = logging.getLogger(__name__)

ENTRY_OVERHEAD_BYTES = 128  # counted per kept answer and per tensor, beside their data
FLUSH_EVERY_S = 1.0  # how often the counts reach the statistics hash


class ResponseCache:
    """Answers by request key, least recently used first out, bounded in bytes."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._kept: OrderedDict[bytes, tuple[dict[str, Tensor], int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: bytes) -> dict[str, Tensor] | None:
        """The outputs kept for ``key`` (now the most recently used), or None."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        self._kept.move_to_end(key)
        return dict(kept[0])

    def put(self, key: bytes, outputs: Mapping[str, Tensor]) -> None:
        """Keep ``outputs`` for ``key``, making room by dropping the least recently used."""
        own = {name: _owned(tensor) for name, tensor in outputs.items()}
        size = ENTRY_OVERHEAD_BYTES + sum(ENTRY_OVERHEAD_BYTES + len(t.data) for t in own.values())
        if size > self.capacity_bytes or not own:
            return
        previous = self._kept.pop(key, None)
        if previous is not None:
            self.used_bytes -= previous[1]
        while self.used_bytes + size > self.capacity_bytes:
            _, (_, dropped) = self._kept.popitem(last=False)
            self.used_bytes -= dropped
        self._kept[key] = (own, size)
        self.used_bytes += size


def request_key(
    model: str,
    version: str,
    inputs: Mapping[str, Tensor],
    outputs: list[str],
    parameters: Mapping[str, Any],
) -> bytes:
    """The digest of what makes two requests of a model the same request."""
    digest = hashlib.blake2b(digest_size=16)
    for text in (model, version, *sorted(outputs)):
        _text(digest, text)
    _text(digest, json.dumps(parameters, sort_keys=True, default=str) if parameters else "")
    for name in sorted(inputs):
        tensor = inputs[name]
        _text(digest, name)
        _text(digest, tensor.datatype)
        _text(digest, ",".join(map(str, tensor.shape)))
        digest.update(len(tensor.data).to_bytes(8, "little"))
        digest.update(tensor.data)
    return digest.digest()


def _text(digest: Any, text: str) -> None:
    raw = text.encode()
    digest.update(len(raw).to_bytes(4, "little"))
    digest.update(raw)


def _owned(tensor: Tensor) -> Tensor:
    """The tensor over bytes of its own: a view would keep a whole reply's buffer alive."""
    if isinstance(tensor.data, bytes):
        return tensor
    return Tensor(tensor.datatype, tensor.shape, bytes(tensor.data))


class CacheCounts:
    """This process's cache hits and misses per model version, written to Redis in bulk."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._pending: dict[tuple[str, str], dict[str, int]] = {}

    def hit(self, model: str, version: str, lookup_ns: int, request_ns: int) -> None:
        counts = self._counts(model, version)
        counts[Field.CACHE_HIT_COUNT] += 1
        counts[Field.CACHE_HIT_NS] += lookup_ns
        counts[Field.SUCCESS_COUNT] += 1
        counts[Field.SUCCESS_NS] += request_ns

    def miss(self, model: str, version: str, cache_ns: int) -> None:
        counts = self._counts(model, version)
        counts[Field.CACHE_MISS_COUNT] += 1
        counts[Field.CACHE_MISS_NS] += cache_ns

    def _counts(self, model: str, version: str) -> dict[str, int]:
        counts = self._pending.get((model, version))
        if counts is None:
            counts = self._pending[(model, version)] = dict.fromkeys(COUNTED, 0)
        return counts

    async def run(self) -> None:
        """Write the counts every :data:`FLUSH_EVERY_S`, for as long as the gateway runs."""
        while True:
            await asyncio.sleep(FLUSH_EVERY_S)
            await self.flush()

    async def flush(self) -> None:
        """Add what was counted since the last flush to the statistics hashes."""
        pending, self._pending = self._pending, {}
        if not pending:
            return
        pipe = self.redis.pipeline(transaction=False)
        for (model, version), counts in pending.items():
            for field, value in counts.items():
                if value:
                    pipe.hincrby(names.model_stats(model, version), field, value)
        try:
            await pipe.execute()
        except RedisError as exc:
            logger.warning("cache statistics not recorded (Redis: %s); counted again", exc)
            for key, counts in pending.items():
                again = self._counts(*key)
                for field, value in counts.items():
                    again[field] += value


COUNTED = (
    Field.CACHE_HIT_COUNT,
    Field.CACHE_HIT_NS,
    Field.CACHE_MISS_COUNT,
    Field.CACHE_MISS_NS,
    Field.SUCCESS_COUNT,
    Field.SUCCESS_NS,
)
