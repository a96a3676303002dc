"""Unit tests of BatchQueue's priority levels, deadlines, restore and eager (work-conserving) take.

Pure: explicit clocks (``now_s`` monotonic, ``now_ms`` wall), no Redis.
"""

from __future__ import annotations

from batcher.policy import BatchQueue, Queued

LONG_DELAY_S = 10.0
LATER_S = 100.0  # past every item's max_queue_delay: the queue must empty what fits


def item(name: str, level: int = 0, size: int = 1, at: float = 0.0, deadline_ms: int = 0) -> Queued:
    return Queued(
        entry_id=name.encode(),
        size=size,
        payload=name.encode(),
        arrived_s=at,
        deadline_ms=deadline_ms,
        level=level,
    )


def names(batch: list[Queued]) -> list[str]:
    return [q.entry_id.decode() for q in batch]


def queue_of(
    *items: Queued,
    max_batch_size: int = 8,
    preferred_sizes: tuple[int, ...] = (),
    max_queue_delay_s: float = 0.0,
) -> BatchQueue:
    queue = BatchQueue(max_batch_size, preferred_sizes, max_queue_delay_s, priority_levels=2)
    for queued in items:
        queue.add(queued)
    return queue


def test_higher_level_leaves_first_and_arrival_order_holds_within_a_level() -> None:
    queue = queue_of(
        item("low-0", level=1, at=0.0),
        item("low-1", level=1, at=0.1),
        item("low-2", level=1, at=0.2),
        item("high-0", level=0, at=0.3),
        item("high-1", level=0, at=0.4),
        item("high-2", level=0, at=0.5),
        max_batch_size=4,
        max_queue_delay_s=LONG_DELAY_S,
    )
    assert len(queue) == 6

    first = queue.take(LATER_S)
    second = queue.take(LATER_S)

    assert names(first) == ["high-0", "high-1", "high-2", "low-0"]
    assert names(second) == ["low-1", "low-2"]
    assert len(queue) == 0
    assert queue.take(LATER_S) == []


def test_a_batch_takes_lower_levels_only_after_every_higher_item_fits() -> None:
    # high-1 does not fit beside high-0; low-0 would, but must not jump ahead of high-1.
    queue = queue_of(
        item("low-0", level=1, size=1),
        item("high-0", level=0, size=3),
        item("high-1", level=0, size=2),
        max_batch_size=4,
        max_queue_delay_s=LONG_DELAY_S,
    )

    assert names(queue.take(LATER_S)) == ["high-0"]
    assert names(queue.take(LATER_S)) == ["high-1", "low-0"]
    assert len(queue) == 0


def test_preferred_size_counts_across_levels_in_priority_order() -> None:
    queue = queue_of(
        item("low-0", level=1),
        item("low-1", level=1),
        item("high-0", level=0),
        preferred_sizes=(2,),
        max_queue_delay_s=LONG_DELAY_S,
    )

    # Not yet past the delay: the preferred size 2 leaves at once, higher level first.
    assert names(queue.take(0.0)) == ["high-0", "low-0"]
    assert names(queue.take(0.0)) == []
    assert names(queue.take(LATER_S)) == ["low-1"]


def test_deadline_is_the_oldest_arrival_across_levels() -> None:
    queue = queue_of(
        item("low-0", level=1, at=1.0),
        item("high-0", level=0, at=5.0),
        max_queue_delay_s=2.0,
    )

    assert queue.deadline_s() == 3.0
    assert queue.take(2.9) == []
    assert names(queue.take(3.0)) == ["high-0", "low-0"]
    assert queue.deadline_s() is None


def test_a_level_past_the_last_joins_the_lowest_level() -> None:
    queue = queue_of(
        item("beyond", level=7),
        item("low", level=1),
        item("high", level=0),
    )

    assert names(queue.take(LATER_S)) == ["high", "beyond", "low"]


def test_drop_expired_removes_only_expired_items_across_levels_and_keeps_order() -> None:
    now_ms = 10_000
    queue = queue_of(
        item("low-gone", level=1, deadline_ms=now_ms - 1),
        item("low-keep", level=1, deadline_ms=now_ms + 5_000),
        item("low-forever", level=1),
        item("high-keep", level=0),
        item("high-at-now", level=0, deadline_ms=now_ms),
        item("high-later", level=0, deadline_ms=now_ms + 1_000),
        item("high-gone", level=0, deadline_ms=1),
        max_queue_delay_s=LONG_DELAY_S,
    )

    expired = queue.drop_expired(now_ms)

    assert sorted(names(expired)) == ["high-at-now", "high-gone", "low-gone"]
    assert len(queue) == 4
    assert queue.drop_expired(now_ms + 999) == []
    assert names(queue.drop_expired(now_ms + 1_000)) == ["high-later"]
    assert len(queue) == 3
    assert names(queue.take(LATER_S)) == ["high-keep", "low-keep", "low-forever"]


def test_drop_expired_sees_deadlines_of_items_added_after_a_drop() -> None:
    queue = queue_of(item("a", deadline_ms=5_000))
    assert queue.drop_expired(1_000) == []

    queue.add(item("b", level=1, deadline_ms=2_000))

    assert names(queue.drop_expired(2_000)) == ["b"]
    assert names(queue.drop_expired(5_000)) == ["a"]
    assert len(queue) == 0


def test_restore_puts_a_batch_back_ahead_in_its_order() -> None:
    queue = queue_of(
        item("high-0", level=0),
        item("high-1", level=0),
        item("low-0", level=1),
        item("low-1", level=1),
        max_batch_size=3,
        max_queue_delay_s=LONG_DELAY_S,
    )
    batch = queue.take(LATER_S)
    assert names(batch) == ["high-0", "high-1", "low-0"]
    assert len(queue) == 1

    queue.restore(batch)

    assert len(queue) == 4
    assert names(queue.take(LATER_S)) == ["high-0", "high-1", "low-0"]
    assert names(queue.take(LATER_S)) == ["low-1"]


def test_restore_keeps_priority_over_what_arrived_meanwhile() -> None:
    queue = queue_of(item("low-0", level=1), item("low-1", level=1), max_batch_size=2)
    batch = queue.take(LATER_S)
    queue.add(item("low-2", level=1))
    queue.add(item("high-new", level=0))

    queue.restore(batch)

    # A restored item goes ahead of its own level; a higher level still leaves first.
    assert names(queue.take(LATER_S)) == ["high-new", "low-0"]
    assert names(queue.take(LATER_S)) == ["low-1", "low-2"]


def test_restore_keeps_deadlines_for_drop_expired() -> None:
    queue = queue_of(item("a", deadline_ms=3_000), max_batch_size=1)
    batch = queue.take(LATER_S)
    assert queue.drop_expired(4_000) == []  # nothing queued: the old deadline is forgotten

    queue.restore(batch)

    assert names(queue.drop_expired(4_000)) == ["a"]


def test_eager_takes_what_is_queued_at_once_despite_a_long_delay() -> None:
    queue = queue_of(
        item("low-0", level=1),
        item("high-0", level=0),
        item("high-1", level=0),
        max_queue_delay_s=LONG_DELAY_S,
    )
    assert queue.take(0.0) == []

    assert names(queue.take(0.0, eager=True)) == ["high-0", "high-1", "low-0"]
    assert len(queue) == 0
    assert queue.take(0.0, eager=True) == []


def test_eager_still_takes_no_more_than_max_batch_size() -> None:
    queue = queue_of(
        *(item(f"r{n}", size=2) for n in range(3)),
        max_batch_size=4,
        max_queue_delay_s=LONG_DELAY_S,
    )

    assert names(queue.take(0.0, eager=True)) == ["r0", "r1"]
    assert names(queue.take(0.0, eager=True)) == ["r2"]


def test_eager_with_preferred_sizes_takes_the_largest_preferred_prefix() -> None:
    queue = BatchQueue(8, (2, 4), LONG_DELAY_S, priority_levels=2)
    for n in range(5):
        queue.add(item(f"r{n}", level=n % 2))

    batch = queue.take(0.0, eager=True)

    assert [q.size for q in batch] == [1, 1, 1, 1]
    assert names(batch) == ["r0", "r2", "r4", "r1"]
    assert len(queue) == 1
    assert names(queue.take(0.0, eager=True)) == ["r3"]
