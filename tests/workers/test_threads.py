"""The worker's torch threads are shared out among the batches computing at once."""

from __future__ import annotations

import time

from workers.threads import ThreadShare


def test_a_batch_alone_gets_every_thread() -> None:
    share = ThreadShare(4)
    with share.computing() as threads:
        assert threads == 4


def test_batches_at_once_share_the_threads_at_least_one_each() -> None:
    share = ThreadShare(4)
    with share.computing() as first, share.computing() as second, share.computing() as third:
        assert (first, second, third) == (4, 2, 1)
    with ThreadShare(1).computing() as only, ThreadShare(1).computing() as other:
        assert (only, other) == (1, 1)


def test_the_share_holds_while_batches_keep_overlapping_then_lapses() -> None:
    share = ThreadShare(2, hold_s=0.2)
    with share.computing(), share.computing():
        pass
    # Between two overlapping batches: the next one still expects company.
    with share.computing() as threads:
        assert threads == 1
    time.sleep(0.3)
    with share.computing() as threads:
        assert threads == 2


def test_the_total_is_set_once_by_the_first_that_knows_it() -> None:
    share = ThreadShare()
    share.know(6)
    share.know(2)
    with share.computing() as threads:
        assert threads == 6
