"""A request's deadline (gateway.deadline) on a real event loop: it cancels the waiting
task, is told apart from any other cancellation, and never fires once cancelled."""

from __future__ import annotations

import asyncio

import pytest

from gateway.deadline import Deadline


async def _wait(
    timeout_s: float, waited: asyncio.Future[str], waiting: asyncio.Future[None] | None = None
) -> str:
    deadline = Deadline(asyncio.get_running_loop(), timeout_s)
    if waiting is not None:
        waiting.set_result(None)  # its waiter resumes once this task awaits ``waited``
    try:
        return await waited
    except asyncio.CancelledError:
        if deadline.absorb():
            return "deadline"
        raise
    finally:
        deadline.cancel()


async def test_a_passed_deadline_is_absorbed_and_the_task_goes_on_uncancelled() -> None:
    never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(_wait(0.001, never))
    assert await task == "deadline"
    assert task.cancelling() == 0
    assert never.cancelled()


async def test_a_cancellation_of_another_kind_stays_a_cancellation() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[str] = loop.create_future()
    waiting: asyncio.Future[None] = loop.create_future()
    task = asyncio.create_task(_wait(60, never, waiting))
    await waiting
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_deadline_and_another_cancellation_together_stay_a_cancellation() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[str] = loop.create_future()
    waiting: asyncio.Future[None] = loop.create_future()
    task = asyncio.create_task(_wait(0.001, never, waiting))
    await waiting
    task.cancel()  # before the deadline fires, and the deadline fires before the task runs
    expired = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.002, expired.set_result, None)
    await expired
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_answer_before_the_deadline_cancels_its_timer() -> None:
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str] = loop.create_future()
    loop.call_soon(answer.set_result, "answer")
    assert await _wait(0.001, answer) == "answer"
    current = asyncio.current_task()
    assert current is not None
    fired = loop.create_future()
    loop.call_later(0.005, fired.set_result, None)
    await fired  # past the deadline: had its timer fired, this task would be cancelled
    assert current.cancelling() == 0


def test_a_deadline_outside_a_task_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="needs a task"):
            Deadline(loop, 1.0)
    finally:
        loop.close()
