"""Unit tests for the dynamic batching rule (batcher.policy.BatchQueue), with explicit clocks."""

from __future__ import annotations

import pytest

from batcher.policy import BatchQueue, Queued


def item(number: int, size: int = 1, at: float = 0.0) -> Queued:
    return Queued(entry_id=f"{number}-0".encode(), size=size, payload=b"p%d" % number, arrived_s=at)


def ids(batch: list[Queued]) -> list[bytes]:
    return [q.entry_id for q in batch]


def fill(queue: BatchQueue, sizes: list[int], at: float = 0.0) -> None:
    for number, size in enumerate(sizes):
        queue.add(item(number, size, at))


def test_empty_queue_yields_nothing_and_has_no_deadline() -> None:
    queue = BatchQueue(8, (), 0.0)
    assert queue.take(100.0) == []
    assert queue.deadline_s() is None
    assert len(queue) == 0


def test_preferred_size_reached_leaves_at_once() -> None:
    queue = BatchQueue(8, (4,), max_queue_delay_s=10.0)
    fill(queue, [1, 1, 1])
    assert queue.take(0.0) == []

    queue.add(item(3))
    batch = queue.take(0.0)

    assert ids(batch) == [b"0-0", b"1-0", b"2-0", b"3-0"]
    assert len(queue) == 0


def test_largest_preferred_prefix_leaves_and_the_rest_waits() -> None:
    queue = BatchQueue(8, (2, 4), max_queue_delay_s=10.0)
    fill(queue, [1, 1, 1, 1, 1])

    batch = queue.take(0.0)

    assert sum(q.size for q in batch) == 4
    assert ids(batch) == [b"0-0", b"1-0", b"2-0", b"3-0"]
    assert len(queue) == 1
    assert queue.take(0.0) == []


def test_preferred_size_counts_each_requests_own_size() -> None:
    queue = BatchQueue(8, (4,), max_queue_delay_s=10.0)
    fill(queue, [3, 1, 2])

    batch = queue.take(0.0)

    assert [q.size for q in batch] == [3, 1]
    assert len(queue) == 1


def test_without_preferred_sizes_nothing_leaves_before_the_delay() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=0.5)
    fill(queue, [1, 1, 1])
    assert queue.take(0.1) == []
    assert queue.take(0.4999) == []
    assert len(queue) == 3


def test_delay_counts_from_the_oldest_request() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=0.01)
    queue.add(item(0, at=0.0))
    queue.add(item(1, at=0.009))

    assert queue.take(0.0095) == []
    batch = queue.take(0.0101)

    assert ids(batch) == [b"0-0", b"1-0"]
    assert len(queue) == 0


def test_expired_delay_releases_as_much_as_fits() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=0.01)
    fill(queue, [2, 2])
    assert [q.size for q in queue.take(0.02)] == [2, 2]


def test_deadline_is_oldest_arrival_plus_delay() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=0.25)
    queue.add(item(0, at=10.0))
    queue.add(item(1, at=10.1))
    assert queue.deadline_s() == pytest.approx(10.25)

    queue.take(10.25)
    assert queue.deadline_s() is None


def test_deadline_moves_to_the_next_oldest_after_a_batch_leaves() -> None:
    queue = BatchQueue(2, (), max_queue_delay_s=1.0)
    queue.add(item(0, at=0.0))
    queue.add(item(1, at=0.5))
    queue.add(item(2, at=0.7))

    assert ids(queue.take(0.7)) == [b"0-0", b"1-0"]
    assert queue.deadline_s() == pytest.approx(1.7)


def test_next_request_not_fitting_makes_a_full_batch_leave_at_once() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=10.0)
    fill(queue, [3, 3, 3])

    batch = queue.take(0.0)

    assert [q.size for q in batch] == [3, 3]
    assert len(queue) == 1
    assert queue.take(0.0) == []


def test_max_batch_size_is_never_exceeded_after_the_delay() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=0.01)
    fill(queue, [5, 2, 4, 1])

    batches = []
    while len(queue):
        batches.append([q.size for q in queue.take(1.0)])

    assert batches == [[5, 2], [4, 1]]
    assert all(sum(b) <= 8 for b in batches)


def test_exactly_max_batch_size_leaves_at_once() -> None:
    queue = BatchQueue(4, (), max_queue_delay_s=10.0)
    fill(queue, [1, 1, 2, 1])

    batch = queue.take(0.0)

    assert [q.size for q in batch] == [1, 1, 2]
    assert len(queue) == 1


def test_request_larger_than_max_leaves_alone() -> None:
    queue = BatchQueue(4, (), max_queue_delay_s=10.0)
    fill(queue, [6, 1])
    assert [q.size for q in queue.take(0.0)] == [6]


def test_arrival_order_is_kept_across_batches() -> None:
    queue = BatchQueue(3, (), max_queue_delay_s=0.0)
    fill(queue, [1] * 7)

    taken: list[bytes] = []
    sizes = []
    while len(queue):
        batch = queue.take(0.0)
        sizes.append(len(batch))
        taken.extend(ids(batch))

    assert sizes == [3, 3, 1]
    assert taken == [f"{n}-0".encode() for n in range(7)]


def test_zero_delay_sends_whatever_is_queued_immediately() -> None:
    queue = BatchQueue(8, (), max_queue_delay_s=0.0)
    queue.add(item(0, at=5.0))
    assert ids(queue.take(5.0)) == [b"0-0"]


def test_zero_delay_with_preferred_sizes_still_sends_below_preferred() -> None:
    queue = BatchQueue(8, (4,), max_queue_delay_s=0.0)
    fill(queue, [1, 1], at=5.0)
    assert len(queue.take(5.0)) == 2


def test_max_batch_size_zero_sends_each_request_alone() -> None:
    queue = BatchQueue(0, (), max_queue_delay_s=10.0)
    assert queue.max_batch_size == 1
    fill(queue, [1, 1, 1])

    batches = [ids(queue.take(0.0)) for _ in range(3)]

    assert batches == [[b"0-0"], [b"1-0"], [b"2-0"]]
    assert queue.take(0.0) == []


def test_payloads_travel_with_their_entries() -> None:
    queue = BatchQueue(2, (), max_queue_delay_s=0.0)
    fill(queue, [1, 1])
    assert [q.payload for q in queue.take(0.0)] == [b"p0", b"p1"]


def test_full_only_holds_a_partial_batch_even_past_its_delay() -> None:
    queue = BatchQueue(8, preferred_sizes=(2, 4), max_queue_delay_s=0.001)
    fill(queue, [1, 1, 1])
    assert queue.take(now_s=10.0, full_only=True) == []
    assert len(queue) == 3


def test_full_only_lets_the_largest_preferred_size_go_ahead() -> None:
    queue = BatchQueue(8, preferred_sizes=(2, 4), max_queue_delay_s=10.0)
    fill(queue, [1, 1, 1, 1, 1])
    assert [q.size for q in queue.take(now_s=0.0, full_only=True)] == [1, 1, 1, 1]
    assert len(queue) == 1


def test_full_only_lets_a_full_batch_go_ahead() -> None:
    queue = BatchQueue(4, max_queue_delay_s=10.0)
    fill(queue, [2, 2, 1])
    assert [q.size for q in queue.take(now_s=0.0, full_only=True)] == [2, 2]
    assert len(queue) == 1


def test_oldest_arrival_is_reported_for_the_hold_deadline() -> None:
    queue = BatchQueue(4)
    assert queue.oldest_s() is None
    queue.add(item(1, at=2.5))
    queue.add(item(2, at=3.0))
    assert queue.oldest_s() == 2.5
