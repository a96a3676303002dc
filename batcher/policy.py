"""When a batch leaves: Triton's dynamic batching rule, work-conserving, as a pure queue.

Requests wait in priority levels (level 0 first), in arrival order within a level. A
request's own leading dimension counts toward the batch. A batch leaves at once when it
can be formed at a preferred size (the largest one that can), when the queue holds a full
batch (``max_batch_size`` reached, or the next request would not fit), or, being
work-conserving, when some worker instance is idle (``eager``): then it takes what is
queued. Otherwise it waits until its oldest request has waited ``max_queue_delay``. With no
delay a batch leaves as soon as anything is queued. Requests whose deadline passed are
taken out apart, to be answered with an error instead of run.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import accumulate


@dataclass(frozen=True, slots=True)
class Queued:
    """One request waiting in the batcher."""

    entry_id: bytes
    size: int
    payload: bytes
    arrived_s: float
    deadline_ms: int = 0
    level: int = 0
    request_id: str = ""
    reply_to: str = ""
    sequence: str = ""  # its sequence's key, for a sequence model (batcher.sequences)
    flags: int = 0  # its sequence's START and END flags
    delay_at_ms: int = 0  # when it moves behind the others (a queue policy's DELAY), unix ms
    counted: bool = False  # counted in its level's queue (a max_queue_size of its level's own)


class BatchQueue:
    """The requests queued for one (model, version), and the rule that empties it."""

    def __init__(
        self,
        max_batch_size: int,
        preferred_sizes: tuple[int, ...] = (),
        max_queue_delay_s: float = 0.0,
        priority_levels: int = 1,
        delays: bool = False,
    ) -> None:
        self.max_batch_size = max(max_batch_size, 1)
        self.preferred_sizes = frozenset(preferred_sizes)
        self.max_queue_delay_s = max_queue_delay_s
        self._top = max(priority_levels, 1) - 1  # the lowest priority level's index
        # With a policy that delays, one more level after the lowest: Triton's delayed queue.
        self.levels: list[deque[Queued]] = [deque() for _ in range(self._top + 1 + delays)]
        self.delays = delays
        self._count = 0
        self._next_expiry_ms = math.inf

    def __len__(self) -> int:
        return self._count

    def add(self, item: Queued) -> None:
        self.levels[self._level(item)].append(item)
        self._count += 1
        self._watch(item)

    def restore(self, items: list[Queued]) -> None:
        """Put back a batch that could not be sent, ahead of everything, in its order."""
        for item in reversed(items):
            self.levels[self._level(item)].appendleft(item)
            self._count += 1
            self._watch(item)

    def _level(self, item: Queued) -> int:
        return min(max(item.level, 0), self._top)

    def _watch(self, item: Queued) -> None:
        """Look again when its deadline passes, or its time to move behind the others."""
        for at_ms in (item.deadline_ms, item.delay_at_ms if self.delays else 0):
            if at_ms:
                self._next_expiry_ms = min(self._next_expiry_ms, at_ms)

    def _ordered(self) -> Iterator[Queued]:
        return itertools.chain.from_iterable(self.levels)

    def oldest_s(self) -> float | None:
        """When the oldest queued request arrived (monotonic), or None if empty."""
        return min((level[0].arrived_s for level in self.levels if level), default=None)

    def deadline_s(self) -> float | None:
        """When the oldest request's delay runs out (monotonic), or None if empty."""
        oldest = self.oldest_s()
        return None if oldest is None else oldest + self.max_queue_delay_s

    def drop_expired(self, now_ms: float) -> list[Queued]:
        """Remove and return every request whose deadline has passed.

        Under a policy that delays, a request past its queue timeout moves behind every
        other, in the delayed level, in the order the timeouts passed.
        """
        if now_ms < self._next_expiry_ms:
            return []
        expired: list[Queued] = []
        delayed: list[Queued] = []
        self._next_expiry_ms = math.inf
        for i, level in enumerate(self.levels):
            keep: deque[Queued] = deque()
            for item in level:
                if item.deadline_ms and item.deadline_ms <= now_ms:
                    expired.append(item)
                elif self.delays and item.delay_at_ms and item.delay_at_ms <= now_ms:
                    delayed.append(replace(item, delay_at_ms=0))
                else:
                    keep.append(item)
                    self._watch(item)
            self.levels[i] = keep
        self.levels[-1].extend(delayed)
        for item in delayed:
            self._watch(item)
        self._count -= len(expired)
        return expired

    def remove_if(self, doomed: Callable[[Queued], bool]) -> list[Queued]:
        """Remove and return every request ``doomed`` says goes (its client left, say)."""
        removed: list[Queued] = []
        for i, level in enumerate(self.levels):
            if not any(doomed(item) for item in level):
                continue
            removed.extend(item for item in level if doomed(item))
            self.levels[i] = deque(item for item in level if not doomed(item))
        self._count -= len(removed)
        return removed

    def take(self, now_s: float, eager: bool = False, full_only: bool = False) -> list[Queued]:
        """The batch that should leave now, removed from the queue; empty if none should.

        ``full_only``: only a full batch leaves (every worker is busy, so anything smaller
        would wait in the stream while more requests could still join it): one at
        ``max_batch_size``, or at the largest preferred size.
        """
        count = self._full_count() if full_only else self._ready_count(now_s, eager)
        batch: list[Queued] = []
        for level in self.levels:
            while level and len(batch) < count:
                batch.append(level.popleft())
        self._count -= len(batch)
        return batch

    def rows(self) -> int:
        """The rows of the batch sent if every queued request that fits went now."""
        totals = self._fitting_totals()
        return totals[-1] if totals else 0

    def _ready_count(self, now_s: float, eager: bool) -> int:
        if not self._count:
            return 0
        totals = self._fitting_totals()
        preferred = [n for n, total in enumerate(totals, 1) if total in self.preferred_sizes]
        if preferred:
            return preferred[-1]
        full = len(totals) < self._count or totals[-1] >= self.max_batch_size
        deadline = self.deadline_s()
        expired = deadline is not None and now_s >= deadline
        return len(totals) if full or expired or eager else 0

    def _full_count(self) -> int:
        if not self._count:
            return 0
        totals = self._fitting_totals()
        # The largest preferred size counts as full: the config says batches need not grow
        # past it, so one that reached it goes ahead to wait in the stream for a worker.
        largest = max(self.preferred_sizes, default=0)
        reached = [n for n, total in enumerate(totals, 1) if total == largest]
        if reached:
            return reached[-1]
        full = len(totals) < self._count or totals[-1] >= self.max_batch_size
        return len(totals) if full else 0

    def _fitting_totals(self) -> list[int]:
        """Running batch sizes of the longest prefix that fits (at least one request)."""
        totals: list[int] = []
        for total in accumulate(item.size for item in self._ordered()):
            if total > self.max_batch_size and totals:
                break
            totals.append(total)
            if total >= self.max_batch_size:
                break
        return totals
