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

With ``--cache-config redis,host=H,port=P`` (Triton's redis cache; also ``password``,
``user``, ``db``, or Weir's ``url=redis://...``; ``WEIR_GATEWAY_RESPONSE_CACHE_REDIS_URL``)
the answers are kept in that Redis instead (:class:`RedisCache`), shared by every gateway
process and replica and kept across restarts; its own ``maxmemory`` and eviction policy
(``allkeys-lru``, say) bound it. It must be a Redis of its own: the mesh's refuses writes
past its memory rather than evict a stream. A cache Redis that fails or is slower than
``WEIR_GATEWAY_RESPONSE_CACHE_TIMEOUT_S`` is passed by (the request goes to the mesh) and
left alone for a second, with a warning, as Triton's redis cache falls back.

Hits and misses are counted in the model's statistics (:class:`CacheCounts`, written to the
statistics hash with the workers' counters): Triton's ``cache_hit`` and ``cache_miss``, and
a hit is a ``success`` (no worker saw it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgpack
from redis.asyncio import Redis
from redis.exceptions import RedisError

from weir import names
from weir.stats import Field
from weir.tensors import Tensor

logger = logging.getLogger(__name__)

CACHE_PREFIX = "weir:cache:"  # a cache Redis's keys, the request key in hex after it
REST_AFTER_FAILURE_S = 1.0
ENTRY_OVERHEAD_BYTES = 128  # counted per kept answer and per tensor, beside their data
FLUSH_EVERY_S = 1.0  # how often the counts reach the statistics hash


class AnswerCache(Protocol):
    """Where answers are kept: this process (:class:`ResponseCache`) or a Redis."""

    async def lookup(self, key: bytes) -> dict[str, Tensor] | None: ...

    async def keep(self, key: bytes, outputs: Mapping[str, Tensor]) -> None: ...

    async def close(self) -> None: ...


def answer_cache(capacity_bytes: int, redis_url: str, timeout_s: float) -> AnswerCache | None:
    """The cache the settings name, if any: a Redis one when it has a URL."""
    if redis_url:
        return RedisCache(redis_url, timeout_s)
    return ResponseCache(capacity_bytes) if capacity_bytes else None


class ResponseCache:
    """Answers by request key, least recently used first out, bounded in bytes."""

    async def lookup(self, key: bytes) -> dict[str, Tensor] | None:
        return self.get(key)

    async def keep(self, key: bytes, outputs: Mapping[str, Tensor]) -> None:
        self.put(key, outputs)

    async def close(self) -> None:
        self._kept.clear()

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


class RedisCache:
    """Answers by request key in a Redis of their own, shared by every gateway."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.redis = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, max_connections=64
        )
        parsed = urlsplit(url)
        self.where = f"{parsed.hostname}:{parsed.port or 6379}"  # no password in a log line
        self._resting_until = 0.0  # after a failure, the cache is passed by until then

    async def lookup(self, key: bytes) -> dict[str, Tensor] | None:
        if self._resting():
            return None
        try:
            raw = await self.redis.get(CACHE_PREFIX + key.hex())
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        return _decoded(raw) if isinstance(raw, bytes) else None

    async def keep(self, key: bytes, outputs: Mapping[str, Tensor]) -> None:
        if self._resting() or not outputs:
            return
        try:
            await self.redis.set(CACHE_PREFIX + key.hex(), _encoded(outputs))
        except (RedisError, OSError) as exc:
            self._failed(exc)

    def _resting(self) -> bool:
        return time.monotonic() < self._resting_until

    def _failed(self, exc: Exception) -> None:
        self._resting_until = time.monotonic() + REST_AFTER_FAILURE_S
        rest_s = REST_AFTER_FAILURE_S
        logger.warning("response cache at %s passed by for %g s: %s", self.where, rest_s, exc)

    async def close(self) -> None:
        await self.redis.aclose()


def _encoded(outputs: Mapping[str, Tensor]) -> bytes:
    packed = {name: [t.datatype, list(t.shape), bytes(t.data)] for name, t in outputs.items()}
    return msgpack.packb(packed, use_bin_type=True)  # type: ignore[no-any-return]


def _decoded(raw: bytes) -> dict[str, Tensor] | None:
    try:
        packed = msgpack.unpackb(raw, raw=False)
        return {
            name: Tensor(kind, tuple(shape), data) for name, (kind, shape, data) in packed.items()
        }
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        logger.warning("a response cache entry could not be read, passed by: %s", exc)
        return None


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
