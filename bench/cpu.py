"""How much CPU other programs used while a point was measured.

The machine may be shared: anything else running takes cores from the servers and the load
generator. Each point records the CPU time the whole machine spent busy (steal included)
less what this run's own processes spent, per second of wall time: 0.0 is a quiet machine,
1.0 means one of the cores was, on average, someone else's.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import psutil

from bench.servers import process_tree


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot; steal counts: the core was not ours."""
    t = psutil.cpu_times()
    fields = ("user", "nice", "system", "irq", "softirq", "steal")
    return sum(getattr(t, name, 0.0) for name in fields)


def own_cpu_s(server_pids: list[int]) -> float:
    """CPU seconds of this process, its finished children (wrk) and the servers' trees."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    finished = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + finished.ru_utime + finished.ru_stime
    for pid in server_pids:
        for process in process_tree(pid):
            try:
                times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += times.user + times.system
    return total


@dataclass(frozen=True)
class CpuMark:
    """A moment's machine-wide and own CPU counters."""

    wall_s: float
    busy_s: float
    own_s: float

    @classmethod
    def now(cls, server_pids: list[int]) -> CpuMark:
        return cls(time.monotonic(), machine_busy_s(), own_cpu_s(server_pids))

    def others_cores(self, later: CpuMark) -> float:
        """Cores' worth of CPU that other programs used between this mark and ``later``."""
        wall = later.wall_s - self.wall_s
        others = (later.busy_s - self.busy_s) - (later.own_s - self.own_s)
        return max(others, 0.0) / wall if wall > 0 else 0.0
