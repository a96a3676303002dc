"""CPU time: what other programs used while a point was measured, and where ours went.

The machine may be shared: anything else running takes cores from the servers and the load
generator. Each point records the CPU time the whole machine spent busy (steal included)
less what this run's own processes spent, per second of wall time: 0.0 is a quiet machine,
1.0 means one of the cores was, on average, someone else's.

Each point also records, per process of the server measured (by its role: Weir's gateway,
batcher, worker, redis-server and ``weir up``; TorchServe's frontend, workers and launcher;
the baseline's one process), the CPU time it spent (user + system, from ``/proc``) divided
by the requests answered. That figure barely moves when a neighbour takes cores, unlike
req/s, so it is the one to steer by, and it shows where each server's time goes.
"""

from __future__ import annotations

import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from bench.servers import process_tree


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot; steal counts: the core was not ours."""
    t = psutil.cpu_times()
    fields = ("user", "nice", "system", "irq", "softirq", "steal")
    return sum(getattr(t, name, 0.0) for name in fields)


def _weir_role(command: list[str]) -> str:
    if "weir.embedded" in command:  # weir up's supervisor, once it has read its settings
        return "weir up"
    subcommand = command[command.index("weir.cli") + 1]
    return "weir up" if subcommand == "up" else subcommand


# (test on the command line and the program's name, role), the first match wins.
ROLES: list[tuple[Callable[[list[str], str], bool], str]] = [
    (lambda cmd, name: name.startswith("redis-server"), "redis"),
    (lambda cmd, name: "org.pytorch.serve.ModelServer" in cmd, "frontend"),
    (lambda cmd, name: any(a.endswith("model_service_worker.py") for a in cmd), "worker"),
    (lambda cmd, name: any(a.endswith("/torchserve") for a in cmd[:2]), "launcher"),
    (lambda cmd, name: "bench.baseline_app" in cmd, "baseline"),
]


def role(command: list[str], name: str) -> str:
    """The part a process plays in its server, from its command line and program name."""
    if "weir.cli" in command[:-1] or "weir.embedded" in command:
        return _weir_role(command)
    found = next((label for test, label in ROLES if test(command, name)), None)
    return found or name


@dataclass(frozen=True)
class ProcessCpu:
    """One process's role and the CPU seconds (user + system) it had spent."""

    role: str
    cpu_s: float


def tree_cpu(pid: int) -> dict[int, ProcessCpu]:
    """CPU spent so far by each process of the tree rooted at ``pid``, by PID."""
    samples = {}
    for process in process_tree(pid):
        try:
            with process.oneshot():
                times = process.cpu_times()
                label = role(process.cmdline(), process.name())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        samples[process.pid] = ProcessCpu(label, times.user + times.system)
    return samples


def per_request_us(
    before: dict[int, ProcessCpu], after: dict[int, ProcessCpu], answered: int
) -> dict[str, float]:
    """µs of CPU per answered request between two samples of a tree, by role.

    Processes of one role add up, named with their count (``worker (2)``); one started in
    between counts from zero; one gone by ``after`` is not counted (it cannot be read).
    """
    if answered <= 0:
        return {}
    counts = Counter(sample.role for sample in after.values())
    spent: dict[str, float] = {}
    for pid, later in after.items():
        earlier = before.get(pid)
        start = earlier.cpu_s if earlier is not None and earlier.role == later.role else 0.0
        key = later.role if counts[later.role] == 1 else f"{later.role} ({counts[later.role]})"
        spent[key] = spent.get(key, 0.0) + max(later.cpu_s - start, 0.0)
    return {key: seconds * 1e6 / answered for key, seconds in spent.items()}


def own_cpu_s(trees: dict[int, dict[int, ProcessCpu]]) -> float:
    """CPU seconds of this process, its finished children (wrk) and the servers' trees."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    finished = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + finished.ru_utime + finished.ru_stime
    return total + sum(s.cpu_s for tree in trees.values() for s in tree.values())


@dataclass(frozen=True)
class CpuMark:
    """A moment's machine-wide and own CPU counters, and each server's processes'."""

    wall_s: float
    busy_s: float
    own_s: float
    trees: dict[int, dict[int, ProcessCpu]]  # by the server's top PID

    @classmethod
    def now(cls, server_pids: list[int]) -> CpuMark:
        trees = {pid: tree_cpu(pid) for pid in server_pids}
        return cls(time.monotonic(), machine_busy_s(), own_cpu_s(trees), trees)

    def others_cores(self, later: CpuMark) -> float:
        """Cores' worth of CPU that other programs used between this mark and ``later``."""
        wall = later.wall_s - self.wall_s
        others = (later.busy_s - self.busy_s) - (later.own_s - self.own_s)
        return max(others, 0.0) / wall if wall > 0 else 0.0

    def server_us(self, later: CpuMark, server_pid: int, answered: int) -> dict[str, float]:
        """µs of CPU per answered request of each of a server's roles, up to ``later``."""
        return per_request_us(self.trees[server_pid], later.trees[server_pid], answered)
