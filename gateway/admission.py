"""Admission: queue requests, or refuse each at once when its model's queue is full.

One Lua script (weir.stages.queue) checks the model's queued-request counter against
``max_queue_size`` (Triton's ``default_queue_policy``) and, where there is room, adds the
request to the model's request stream and counts it. The counter and the stream share the
model's hash tag, so the script runs on one Redis Cluster slot. Workers and the batcher
decrement the counter in the transactions that answer requests.

Requests are coalesced: every request that arrives while the previous flush is on its way
to Redis waits for the next one, and a flush is one round trip for all of them (one script
call per model and version, pipelined). At concurrency 1 a request goes out at once, alone;
under load a gateway pays the per-command cost once per flush, not per request. Flushes go
over the gateway's own hot-path connection (:class:`~weir.redis_io.link.Link`, or a cluster's).

Redis runs under ``maxmemory-policy noeviction``: past ``maxmemory`` it refuses every write,
and every command of a MULTI (XACK and DECRBY too), which is how the batcher and the workers
answer requests. A Redis filled to its limit would answer nothing more, so admission stops
short of it (:class:`MemoryGauge`) and what was accepted has the rest to be answered in. On
a Redis Cluster each primary has its own ``maxmemory``: a gauge per primary, each read from
its own server, decides for the models whose slots it holds.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from weir import names, stages
from weir.errors import NotFound, Unavailable, WeirError
from weir.redis_io.link import Arg, Command, HotLink
from weir.wire import InferRequest

ADMITTED, FULL, CLOSED, NO_MEMORY, LEVEL_FULL = 1, 0, -1, -2, -3
# Redis's used memory is read at most this often: INFO costs Redis more than an admission.
MEMORY_SAMPLE_S = 0.1
INFO: Command = ("INFO", "memory")


@dataclass(slots=True)
class _Entry:
    args: list[Arg]
    admitted: asyncio.Future[int]


# What one flush carries: the entries of each (model, version), in arrival order.
_Queues = defaultdict[tuple[str, str], list[_Entry]]


class MemoryGauge:
    """Redis's used memory against the share of its ``maxmemory`` admission may fill.

    ``INFO memory`` is read at most every :data:`MEMORY_SAMPLE_S`, riding on a flush (no
    round trip of its own while requests flow); between reads the bytes this gateway queued
    are added, so a burst is counted before the next read sees it.
    """

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction  # 0: no limit of the gateway's own
        self.used_bytes = 0
        self.max_bytes = 0  # Redis's maxmemory; 0: none
        self.limit_bytes = 0  # fraction of max_bytes; 0: admit
        self._sampled_s = -math.inf

    def admits(self, size: int) -> bool:
        return not self.limit_bytes or self.used_bytes + size <= self.limit_bytes

    def claim(self) -> bool:
        """True when a read is due; the caller then sends one and hands it to ``update``."""
        now_s = time.monotonic()
        if not self.fraction or now_s - self._sampled_s < MEMORY_SAMPLE_S:
            return False
        self._sampled_s = now_s  # claimed: requests arriving meanwhile send no read of their own
        return True

    def update(self, info: Any) -> None:
        if not isinstance(info, bytes):  # INFO refused (an ACL): Redis's own limit holds
            self.limit_bytes = 0
            return
        self.used_bytes = _info_int(info, b"used_memory")
        self.max_bytes = _info_int(info, b"maxmemory")
        # At least a byte: a maxmemory so small the share rounds to 0 still refuses.
        self.limit_bytes = max(int(self.max_bytes * self.fraction), 1) if self.max_bytes else 0


def _info_int(info: bytes, field: bytes) -> int:
    """One integer field of an INFO reply (``name:value`` lines); 0 when it is missing."""
    start = info.find(b"\n" + field + b":")
    if start < 0:
        return 0
    start += len(field) + 2
    return int(info[start : info.index(b"\r", start)])


class Admission:
    """Queues requests on their model's stream, bounded by the model's queue policy."""

    def __init__(
        self, link: HotLink, check_open: bool = False, memory_fraction: float = 0.8
    ) -> None:
        self.link = link
        self.check_open = check_open  # a model control mode: versions open and close
        self.memory_fraction = memory_fraction
        self._gauges: dict[Hashable, MemoryGauge] = {}  # by the server (one on one Redis)
        self._unknown = MemoryGauge(0)  # a cluster's server not known yet: admits, reads none
        self._slots: dict[str, int] = {}  # each model's slot (its keys' hash tag)
        self._next: _Queues = defaultdict(list)
        self._flushing: asyncio.Task[None] | None = None

    async def enqueue(
        self,
        model: str,
        version: str,
        fields: dict[bytes, bytes],
        max_queue_size: int,
        readmit: bool = False,
        level_bound: tuple[int, int] = (0, 0),
    ) -> int:
        """Queue the entry: ADMITTED, FULL, LEVEL_FULL, CLOSED or NO_MEMORY.

        FULL: the queue already holds ``max_queue_size`` requests; LEVEL_FULL: the request's
        priority level's queue holds its own ``max_queue_size`` (``level_bound``: the level
        and that bound, 0 for none); CLOSED (the version admits nothing) happens in the
        model control modes only; NO_MEMORY: Redis holds the share of its maxmemory that
        admission may fill (see :class:`MemoryGauge`). With ``readmit`` (a request admitted
        once, queued again after Redis lost it) the memory share does not apply.

        RedisError when the flush that carried it failed: the entry may or may not have
        been added (Redis ran the scripts before the connection broke, or not).
        """
        size = sum(map(len, fields.values()))
        gauge = self.gauge(model)
        if not readmit and not await self._memory_admits(model, gauge, size):
            return NO_MEMORY
        args = stages.entry_args(fields, max_queue_size, *level_bound)
        admitted: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._next[(model, version)].append(_Entry(args, admitted))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush_all(), name="admission flush")
        queued = await admitted
        if queued == ADMITTED:
            gauge.used_bytes += size
        return queued

    def gauge(self, model: str) -> MemoryGauge:
        """The memory gauge of the server that holds ``model``'s queue."""
        slot = self._slots.get(model)
        if slot is None:
            slot = self._slots[model] = self.link.slot_of(names.serving_versions(model))
        node = self.link.node_of(slot)
        if node is None:
            return self._unknown
        gauge = self._gauges.get(node)
        if gauge is None:
            gauge = self._gauges[node] = MemoryGauge(self.memory_fraction)
        return gauge

    async def _memory_admits(self, model: str, gauge: MemoryGauge, size: int) -> bool:
        if gauge.admits(size):
            return True
        # Refusing sends no flush, so no read would ride on one: read on its own, once due,
        # from the model's server (a keyless command goes where the command before it goes).
        if not gauge.claim():
            return False
        _, info = await self.link.call(("EXISTS", names.serving_versions(model)), INFO)
        gauge.update(info)
        return gauge.admits(size)

    async def _flush_all(self) -> None:
        # Started by the first request of a flush; runs until nothing is left to send.
        # Being a task, it first lets every request already runnable join this flush.
        try:
            while self._next:
                flush, self._next = self._next, defaultdict(list)
                await self._flush(flush)
        finally:
            self._flushing = None

    async def _flush(self, flush: _Queues) -> None:
        queues = list(flush.items())
        commands: list[Command] = []
        samples: list[tuple[int, MemoryGauge]] = []  # where each INFO's reply will be
        for (model, version), entries in queues:
            check = version if self.check_open else ""
            args = (a for e in entries for a in e.args)
            commands.append(stages.queue(model, version, args, check))
            gauge = self.gauge(model)
            if gauge.claim():  # once per server and flush: claimed now, not due again yet
                # Keyless, the INFO goes to the server the script before it went to.
                samples.append((len(commands), gauge))
                commands.append(INFO)
        try:
            results = await self.link.call(*commands)
        except RedisError as exc:
            for _, entries in queues:
                _fail(entries, exc)
            return
        except BaseException as exc:  # cancelled: nobody waits in vain
            for _, entries in queues:
                _fail(entries, RedisError(f"admission was interrupted: {exc!r}"))
            raise
        # Each read after its model's script: the entries are counted in it and again as
        # each enqueue returns, until the next read (erring towards refusing).
        for at, gauge in reversed(samples):
            gauge.update(results.pop(at))
        _settle(queues, results)


def _settle(queues: list[tuple[tuple[str, str], list[_Entry]]], results: list[Any]) -> None:
    """Hand each entry its script's answer, or its script's error (OOM past maxmemory)."""
    for (_, entries), result in zip(queues, results, strict=True):
        if isinstance(result, RedisError):
            _fail(entries, result)
            continue
        for entry, queued in zip(entries, result, strict=True):
            if not entry.admitted.done():
                entry.admitted.set_result(int(queued))


def _fail(entries: list[_Entry], error: RedisError) -> None:
    for entry in entries:
        if not entry.admitted.done():
            entry.admitted.set_exception(error)


def refusal(
    request: InferRequest, admitted: int, limit: int, memory: MemoryGauge, retry_after_s: int
) -> WeirError:
    """The error for a request admission did not queue (Triton's words where it has them)."""
    if admitted == CLOSED:
        return NotFound(
            f"Request for unknown model: '{request.model}' version {request.version} is unloaded"
        )
    if admitted in (FULL, LEVEL_FULL):  # ``limit``: the bound of the queue that was full
        return Unavailable(
            f"request for model '{request.model}' version '{request.version}' exceeds "
            f"maximum queue size {limit}",
            retry_after_s,
        )
    return Unavailable(
        f"Redis holds {memory.used_bytes} bytes, past the {memory.limit_bytes} of its "
        f"maxmemory {memory.max_bytes} that new requests may fill "
        "(WEIR_GATEWAY_ADMISSION_MEMORY_FRACTION); retry later",
        retry_after_s,
    )
