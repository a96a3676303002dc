"""A burst of readiness probes shares one read; a new generation or an old read reads again."""

from __future__ import annotations

import asyncio

import pytest

from gateway.readiness_cache import ReadinessCache, Served


class Reads:
    """A read of the served pairs that counts its calls and can be held open."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False

    async def __call__(self) -> Served:
        self.calls += 1
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("Redis is gone")
        return {("m", "1")}


async def test_concurrent_probes_share_the_read_in_flight() -> None:
    cache, reads = ReadinessCache(), Reads()
    reads.gate.clear()
    probes = [asyncio.create_task(cache.get(reads, 0.0, 1)) for _ in range(1000)]
    await asyncio.sleep(0)
    reads.gate.set()
    assert all(served == {("m", "1")} for served in await asyncio.gather(*probes))
    assert reads.calls == 1


async def test_a_read_is_reused_until_it_is_max_age_old() -> None:
    cache, reads = ReadinessCache(), Reads()
    await cache.get(reads, 60.0, 1)
    await cache.get(reads, 60.0, 1)
    assert reads.calls == 1
    await cache.get(reads, 0.0, 1)
    assert reads.calls == 2


async def test_a_new_generation_reads_again() -> None:
    cache, reads = ReadinessCache(), Reads()
    await cache.get(reads, 60.0, 1)
    await cache.get(reads, 60.0, 2)
    assert reads.calls == 2


async def test_a_probe_that_leaves_does_not_cancel_the_shared_read() -> None:
    cache, reads = ReadinessCache(), Reads()
    reads.gate.clear()
    leaving = asyncio.create_task(cache.get(reads, 60.0, 1))
    staying = asyncio.create_task(cache.get(reads, 60.0, 1))
    await asyncio.sleep(0)
    leaving.cancel()
    reads.gate.set()
    assert await staying == {("m", "1")}
    assert reads.calls == 1


async def test_a_failed_read_fails_the_probes_that_share_it() -> None:
    cache, reads = ReadinessCache(), Reads()
    reads.fail = True
    with pytest.raises(ConnectionError):
        await cache.get(reads, 0.0, 1)
    reads.fail = False
    assert await cache.get(reads, 0.0, 1) == {("m", "1")}
