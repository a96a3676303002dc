"""TorchServe's host gauges, read from Linux's ``/proc`` and the root file system per scrape.

``CPUUtilization`` is the share of the CPU time busy since the previous scrape (since boot
at the first), as psutil's ``cpu_percent()`` is, which TorchServe calls. ``MemoryUsed`` is
the total less what is available (megabytes), ``MemoryUtilization`` that as a percentage;
the disk gauges are the root file system's (gigabytes, percent). Percentages have one
decimal, as psutil's. A value that cannot be read on this system is left out rather than
shown as 0.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from prometheus_client import Metric

_MIB = 1024 * 1024
_GIB = 1024 * _MIB
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal (guest time is
# already inside user and nice). Idle and iowait are the time not busy.
_IDLE_FIELDS = (3, 4)


class HostSampler:
    """Samples the host's CPU, memory and disk for TorchServe's gauges."""

    def __init__(self, proc: Path = Path("/proc"), root: str = "/") -> None:
        self.proc = proc
        self.root = root
        self._lock = threading.Lock()
        self._last: tuple[int, int] = (0, 0)  # busy and total jiffies at the last sample

    def families(self, labels: dict[str, str]) -> list[Metric]:
        gauges = []
        for name, text, value in self._values():
            gauge = Metric(name, f"{text} (TorchServe's name)", "gauge")
            if value is not None:
                gauge.add_sample(name, labels, value)
            gauges.append(gauge)
        return gauges

    def _values(self) -> list[tuple[str, str, float | None]]:
        total_mib, available_mib = self._memory()
        used_mib = None if total_mib is None or available_mib is None else total_mib - available_mib
        disk = self._disk()
        return [
            ("CPUUtilization", "CPU busy since the last scrape, percent", self._cpu()),
            ("MemoryUsed", "Memory used, megabytes", used_mib),
            ("MemoryAvailable", "Memory available, megabytes", available_mib),
            (
                "MemoryUtilization",
                "Memory used, percent",
                None if used_mib is None or not total_mib else round(used_mib / total_mib * 100, 1),
            ),
            (
                "DiskUsage",
                "Root file system used, gigabytes",
                None if disk is None else disk[0] / _GIB,
            ),
            (
                "DiskUtilization",
                "Root file system used, percent",
                None if disk is None else disk[2],
            ),
            (
                "DiskAvailable",
                "Root file system free, gigabytes",
                None if disk is None else disk[1] / _GIB,
            ),
        ]

    def _cpu(self) -> float | None:
        try:
            with open(self.proc / "stat", "rb") as stat:
                fields = [int(f) for f in stat.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        total = sum(fields)
        busy = total - sum(fields[i] for i in _IDLE_FIELDS if i < len(fields))
        with self._lock:
            last_busy, last_total = self._last
            self._last = (busy, total)
        if total <= last_total:
            return 0.0
        return round((busy - last_busy) / (total - last_total) * 100, 1)

    def _memory(self) -> tuple[float | None, float | None]:
        found: dict[bytes, float] = {}
        try:
            with open(self.proc / "meminfo", "rb") as meminfo:
                for line in meminfo:
                    key, _, rest = line.partition(b":")
                    if key in (b"MemTotal", b"MemAvailable"):
                        found[key] = int(rest.split()[0]) * 1024 / _MIB  # kB
        except (OSError, ValueError, IndexError):
            return None, None
        return found.get(b"MemTotal"), found.get(b"MemAvailable")

    def _disk(self) -> tuple[float, float, float] | None:
        """Used and free bytes of the root file system, and used as psutil's percent."""
        try:
            vfs = os.statvfs(self.root)
        except OSError:
            return None
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        free = vfs.f_bavail * vfs.f_frsize  # what an unprivileged user may still write
        percent = used / (used + free) * 100 if used + free else 0.0
        return float(used), float(free), round(percent, 1)
