"""The worker gives freed heap memory back once per idle spell, never while batches run."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from workers.memory import IdleTrim, malloc_trim


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
