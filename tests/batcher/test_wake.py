"""The lane's wake (batcher.lane.Wake) on a real event loop: set before or during a wait,
a wait that times out, and a wait cancelled midway."""

from __future__ import annotations

import asyncio

import pytest

from batcher.wake import Wake


async def test_a_wake_set_before_the_wait_returns_at_once_and_clear_resets_it() -> None:
    wake = Wake()
    wake.set()
    await asyncio.wait_for(wake.wait(None), 1.0)
    wake.clear()
    assert not wake.is_set()


async def test_a_wake_set_while_waiting_ends_the_wait() -> None:
    wake = Wake()
    asyncio.get_running_loop().call_soon(wake.set)
    await asyncio.wait_for(wake.wait(None), 1.0)
    assert wake.is_set()


async def test_a_wait_ends_at_its_timeout_unset() -> None:
    wake = Wake()
    await asyncio.wait_for(wake.wait(0.001), 1.0)
    assert not wake.is_set()
    wake.set()  # no waiter left: nothing to resolve, nothing raised
    assert wake.is_set()


async def test_a_cancelled_wait_leaves_the_wake_usable() -> None:
    wake = Wake()
    with pytest.raises(TimeoutError):  # wait_for cancels the wait at its timeout
        await asyncio.wait_for(wake.wait(None), 0.001)
    wake.set()  # the cancelled waiter is gone
    await asyncio.wait_for(wake.wait(None), 1.0)
