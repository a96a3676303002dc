"""Giving memory back after a burst: one malloc arena, and ``malloc_trim`` once idle a while.

glibc gives each thread that contends for the heap an arena of its own, and each arena keeps
the high-water mark of the batches its thread ran: two instances of bert_mini held two sets
of activations (worker 775 MB after a burst, 602 MB with one arena, at the same speed:
torch allocates few, large blocks, so the one lock is not contended). ``MALLOC_ARENA_MAX``
in the environment, which glibc reads itself, wins over :func:`limit_arenas`.

glibc keeps the heap memory a big batch's activations freed, for reuse; an idle worker
would hold it for nothing, hundreds of MB after batches of 64 of a transformer. When no
batch has finished for ``idle_s``, the worker asks glibc to return its free pages, once per
idle spell and off the event loop. Where the C library is not glibc there is nothing to ask.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


M_ARENA_MAX = -8  # glibc's mallopt parameter number
WORKER_ARENAS = 1


def limit_arenas(arenas: int = WORKER_ARENAS) -> bool:
    """Cap glibc's malloc arenas, before the instance threads start; False where not glibc."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def malloc_trim() -> Callable[[], object] | None:
    """Glibc's ``malloc_trim(0)``, or None where there is no such function."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


class IdleTrim:
    """Trims the heap when ``last_batch_s()`` (monotonic) is ``idle_s`` in the past."""

    def __init__(self, idle_s: float, last_batch_s: Callable[[], float]) -> None:
        self.idle_s = idle_s
        self.last_batch_s = last_batch_s
        self.trim = malloc_trim()
        self.trimmed_after = 0.0  # the batch time the last trim followed

    async def run(self, should_exit: asyncio.Event) -> None:
        if self.trim is None or self.idle_s <= 0:
            return
        while not should_exit.is_set():
            await asyncio.sleep(min(self.idle_s, 1.0))
            last = self.last_batch_s()
            if last > self.trimmed_after and time.monotonic() - last >= self.idle_s:
                self.trimmed_after = last
                await asyncio.to_thread(self.trim)
                logger.debug("returned free heap memory after %.1f s idle", self.idle_s)
