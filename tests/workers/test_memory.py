"""The worker gives freed heap memory back once per idle spell, never while batches run."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from workers.memory import IdleTrim, limit_arenas, malloc_trim


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_malloc_trim_is_found_on_glibc() -> None:
    trim = malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was released, 0: there was none to release


def test_trims_once_per_idle_spell() -> None:
    last_batch = [time.monotonic()]
    trims: list[float] = []
    idle = IdleTrim(0.2, lambda: last_batch[0])
    idle.trim = lambda: trims.append(time.monotonic())

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(idle.run(stop))
        # Busy: a batch every 50 ms, so the worker is never idle for 0.2 s.
        for _ in range(8):
            await asyncio.sleep(0.05)
            last_batch[0] = time.monotonic()
        assert trims == []
        await asyncio.sleep(0.7)  # one idle spell: one trim, however long it lasts
        assert len(trims) == 1
        last_batch[0] = time.monotonic()  # another batch, another spell
        await asyncio.sleep(0.7)
        assert len(trims) == 2
        stop.set()
        await task

    asyncio.run(scenario())


def test_zero_means_never() -> None:
    idle = IdleTrim(0, time.monotonic)
    asyncio.run(asyncio.wait_for(idle.run(asyncio.Event()), 1))  # returns at once


# Two threads, one after the other, each mallocs 64 MB in 64 KiB blocks (below glibc's mmap
# threshold, so from an arena), each followed by a small block it keeps (as live tensors do:
# the heap cannot shrink past them), then frees the big ones; prints the peak RSS in MB.
TWO_THREADS = """
import ctypes, sys, threading
from workers.memory import limit_arenas
if sys.argv[1] == "limit":
    assert limit_arenas()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def burst():
    blocks, pins = [], []
    for _ in range(1024):
        blocks.append(libc.malloc(65536))
        pins.append(libc.malloc(64))
    for block in blocks:
        libc.memset(block, 1, 65536)
    for block in blocks:
        libc.free(block)
    return pins

done, hold = threading.Event(), threading.Event()
first = threading.Thread(target=lambda: (burst(), done.set(), hold.wait()))
first.start()
done.wait()
second = threading.Thread(target=burst)  # the first still lives: glibc gives it a new arena
second.start()
second.join()
hold.set()
first.join()
# VmHWM, not ru_maxrss: that one carries the parent's peak across fork and exec.
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) // 1024)
"""


def peak_mb(mode: str) -> int:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", TWO_THREADS, mode], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.mark.skipif(malloc_trim() is None, reason="glibc only")
def test_one_arena_lets_instance_threads_reuse_each_others_freed_memory() -> None:
    # Without the cap the second thread's 64 MB come from a new arena while the first
    # thread's freed 64 MB stay in its own: twice the memory for the same work.
    assert peak_mb("limit") + 40 < peak_mb("default")


def test_malloc_arena_max_in_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas() is False  # glibc already read it at start
