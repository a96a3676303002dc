"""Resident memory of a process tree, sampled in the background while load runs."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import TracebackType

import psutil

from bench.cpu import role
from bench.servers import process_tree

MIB = 1024 * 1024


def label(process: psutil.Process) -> str:
    """A short name: ``weir`` and its subcommand (and pool) for Weir's, else its role.

    The role is :func:`bench.cpu.role`'s: TorchServe's ``frontend``, ``worker`` and
    ``launcher``, the ``baseline``, else the program's name.
    """
    try:
        command = process.cmdline()
        if "weir.cli" not in command:
            return role(command, process.name())
        words = ["weir", command[command.index("weir.cli") + 1]]
        if "--pool" in command[:-1]:
            words.append(command[command.index("--pool") + 1])
        return " ".join(words)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"


def tree_rss(pid: int) -> list[tuple[str, int]]:
    """(label, resident bytes) of every process in the tree rooted at ``pid``."""
    sizes = []
    for process in process_tree(pid):
        try:
            sizes.append((label(process), process.memory_info().rss))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sizes


@dataclass
class PeakRss:
    """Samples a process tree's total RSS every ``interval_s`` and keeps the peak."""

    pid: int
    interval_s: float = 0.5
    peak_bytes: int = 0
    at_peak: list[tuple[str, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        sizes = tree_rss(self.pid)
        total = sum(size for _, size in sizes)
        if total > self.peak_bytes:
            self.peak_bytes, self.at_peak = total, sizes

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakRss:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
