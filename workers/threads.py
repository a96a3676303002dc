"""The worker's torch threads, shared out among the batches computing.

A batch gets ``total // n`` threads, where ``n`` is the most batches that computed at once
within the last ``hold_s`` (this one included): alone, every thread; two instances busy,
half each. Two batches thus never run four threads on two cores, where each stalls whenever
the other preempts one of its threads. Under steady load one instance often starts while
the other is between batches; the hold keeps it at its share rather than briefly taking
every thread and then sharing the cores with the other's next batch. A batch's count is
fixed when it starts.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

HOLD_S = 1.0


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container limits it)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class ThreadShare:
    """Counts the batches computing and gives each starting one its share of ``total``."""

    def __init__(self, total: int = 0, hold_s: float = HOLD_S) -> None:
        self.total = total  # 0: not known yet; the first backend that knows sets it
        self.hold_s = hold_s
        self._computing = 0
        self._peak = 0  # the most computing at once lately
        self._peak_s = 0.0  # when the computing count last reached the peak
        self._lock = threading.Lock()

    def know(self, total: int) -> None:
        if not self.total:
            self.total = max(total, 1)

    @contextmanager
    def computing(self) -> Iterator[int]:
        """While a batch computes: yields its thread count."""
        with self._lock:
            self._computing += 1
            now = time.monotonic()
            if self._computing >= self._peak or now - self._peak_s > self.hold_s:
                self._peak = self._computing
                self._peak_s = now
            threads = max(self.total // self._peak, 1)
        try:
            yield threads
        finally:
            with self._lock:
                if self._computing == self._peak:
                    self._peak_s = time.monotonic()
                self._computing -= 1
