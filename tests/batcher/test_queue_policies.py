"""Triton's queue policies per priority level: a request past its queue timeout under a
policy that delays moves behind every other, instead of failing.

Pure: explicit clocks, no Redis (the per-level bound is shown end to end in
tests/gateway/test_priority_queue_policy.py).
"""

from __future__ import annotations

from dataclasses import replace

from batcher.policy import BatchQueue, Queued

LATER_S = 100.0


def item(name: str, level: int = 0, delay_at_ms: int = 0, deadline_ms: int = 0) -> Queued:
    return Queued(name.encode(), 1, b"", 0.0, deadline_ms, level, delay_at_ms=delay_at_ms)


def names(batch: list[Queued]) -> list[str]:
    return [q.entry_id.decode() for q in batch]


def test_a_request_past_its_queue_timeout_waits_behind_the_others() -> None:
    queue = BatchQueue(2, priority_levels=2, delays=True)
    for queued in (item("late", 0, delay_at_ms=1000), item("a", 0), item("b", 1)):
        queue.add(queued)
    assert queue.drop_expired(999) == []
    assert queue.drop_expired(1000) == []  # delayed, not failed
    assert len(queue) == 3
    assert names(queue.take(LATER_S)) == ["a", "b"]
    assert names(queue.take(LATER_S)) == ["late"]


def test_a_delayed_request_still_fails_at_its_deadline() -> None:
    queue = BatchQueue(4, delays=True)
    queue.add(item("late", delay_at_ms=1000, deadline_ms=5000))
    queue.drop_expired(1000)
    assert names(queue.drop_expired(5000)) == ["late"]
    assert len(queue) == 0


def test_without_a_policy_that_delays_the_time_is_ignored() -> None:
    queue = BatchQueue(4, priority_levels=2)
    queue.add(item("first", 1, delay_at_ms=1000))
    queue.add(item("second", 1))
    assert queue.drop_expired(2000) == []
    assert names(queue.take(LATER_S)) == ["first", "second"]


def test_a_restored_batch_goes_back_to_its_own_level() -> None:
    queue = BatchQueue(1, priority_levels=2, delays=True)
    queue.add(item("late", 1, delay_at_ms=1000))
    queue.drop_expired(1000)
    (taken,) = queue.take(LATER_S)
    queue.restore([replace(taken)])
    queue.add(item("fresh", 1))
    assert names(queue.take(LATER_S)) == ["late"]  # restored ahead, as any failed send is
