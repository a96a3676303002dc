"""When a batch leaves: Triton's dynamic batching rule, as a pure queue.

Requests keep arrival order. A request's own leading dimension counts toward the batch.
A batch leaves at once when it can be formed at a preferred size (the largest one that
can), or when the queue holds a full batch (``max_batch_size`` reached, or the next
request would not fit); otherwise it waits until its oldest request has waited
``max_queue_delay``, then leaves with as much as fits. With no delay a batch leaves as soon
as anything is queued.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True, slots=True)
class Queued:
    """One request waiting in the batcher."""

    entry_id: bytes
    size: int
    payload: bytes
    arrived_s: float


class BatchQueue:
    """The requests queued for one (model, version), and the rule that empties it."""

    def __init__(
        self,
        max_batch_size: int,
        preferred_sizes: tuple[int, ...] = (),
        max_queue_delay_s: float = 0.0,
    ) -> None:
        self.max_batch_size = max(max_batch_size, 1)
        self.preferred_sizes = frozenset(preferred_sizes)
        self.max_queue_delay_s = max_queue_delay_s
        self.items: deque[Queued] = deque()

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Queued) -> None:
        self.items.append(item)

    def deadline_s(self) -> float | None:
        """When the oldest request's delay runs out (monotonic), or None if empty."""
        if not self.items:
            return None
        return self.items[0].arrived_s + self.max_queue_delay_s

    def take(self, now_s: float) -> list[Queued]:
        """The batch that should leave now, removed from the queue; empty if none should."""
        count = self._ready_count(now_s)
        return [self.items.popleft() for _ in range(count)]

    def _ready_count(self, now_s: float) -> int:
        if not self.items:
            return 0
        totals = self._fitting_totals()
        preferred = [n for n, total in enumerate(totals, 1) if total in self.preferred_sizes]
        if preferred:
            return preferred[-1]
        full = len(totals) < len(self.items) or totals[-1] >= self.max_batch_size
        expired = now_s >= self.items[0].arrived_s + self.max_queue_delay_s
        return len(totals) if full or expired else 0

    def _fitting_totals(self) -> list[int]:
        """Running batch sizes of the longest prefix that fits (at least one request)."""
        totals: list[int] = []
        for total in accumulate(item.size for item in self.items):
            if total > self.max_batch_size and totals:
                break
            totals.append(total)
            if total >= self.max_batch_size:
                break
        return totals
