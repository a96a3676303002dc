"""A free instance beside a busy one waits a little for a batch the size of the busy one's.

The rule (batcher.in_flight) against explicit clocks: it never waits with one instance, with
every instance free, before any batch time is known, or once the queue holds as many rows
as the newest batch in flight; otherwise it waits from the oldest request's arrival for the
configured fraction of the lane's batch time, and forgets a batch never credited back.
A lane against a real Redis shows the wiring: its sends and credits keep the tracker.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import yaml
from redis.asyncio import Redis

from batcher.in_flight import InFlight
from batcher.lane import BatcherLane
from tests.conftest import private_redis
from weir import names, wire
from weir.redis_io.link import Link
from weir.repository import ModelEntry, Repository
from weir.streams import Entry, StreamGroup


def timed(fraction: float = 0.25, batch_s: float = 0.08) -> InFlight:
    """A tracker that has seen one batch take ``batch_s``, with one batch of 32 in flight."""
    tracker = InFlight(fraction)
    tracker.sent(0.0, 32)
    tracker.credited(batch_s, 1)
    tracker.sent(10.0, 32)
    return tracker


def test_batch_time_is_learned_from_send_to_credit_and_smoothed() -> None:
    tracker = InFlight(0.25)
    assert tracker.batch_s == 0.0
    tracker.sent(1.0, 8)
    tracker.sent(1.01, 8)
    tracker.credited(1.1, 1)  # the oldest batch is done: 0.1 s
    assert tracker.batch_s == pytest.approx(0.1)
    assert len(tracker) == 1
    tracker.credited(1.31, 1)  # 0.3 s, weighted in
    assert tracker.batch_s == pytest.approx(0.1 + 0.2 * (0.3 - 0.1))
    assert len(tracker) == 0
    tracker.credited(2.0, 3)  # credits with nothing in flight (a worker starting) change nothing
    assert tracker.batch_s == pytest.approx(0.14)


def test_a_free_instance_beside_a_busy_one_waits_a_fraction_of_the_batch_time() -> None:
    tracker = timed(fraction=0.25, batch_s=0.08)
    hold = tracker.hold_until(10.005, 10.001, queued_rows=4, credits=1, instances=2)
    assert hold == pytest.approx(10.001 + 0.25 * 0.08)
    # Past that, the batch goes with what is queued.
    assert tracker.hold_until(10.03, 10.001, queued_rows=4, credits=1, instances=2) is None


def test_no_wait_once_the_queue_matches_the_batch_in_flight() -> None:
    tracker = timed()
    assert tracker.hold_until(10.005, 10.001, queued_rows=32, credits=1, instances=2) is None
    assert tracker.hold_until(10.005, 10.001, queued_rows=40, credits=1, instances=2) is None


@pytest.mark.parametrize(
    ("credits", "instances"),
    [(1, 1), (2, 2), (3, 2)],
    ids=["one instance", "every instance free", "more credits than instances"],
)
def test_no_wait_when_no_other_instance_is_busy(credits: int, instances: int) -> None:
    tracker = timed()
    assert tracker.hold_until(10.005, 10.001, 1, credits, instances) is None


def test_no_wait_before_a_batch_time_is_known_or_when_turned_off() -> None:
    fresh = InFlight(0.25)
    fresh.sent(0.0, 32)
    assert fresh.hold_until(0.001, 0.0005, 1, credits=1, instances=2) is None
    assert timed(fraction=0.0).hold_until(10.005, 10.001, 1, 1, 2) is None


def test_no_wait_with_nothing_in_flight_and_a_cleared_tracker_waits_on_nothing() -> None:
    tracker = timed()
    tracker.clear()
    assert len(tracker) == 0
    assert tracker.hold_until(10.005, 10.001, 1, credits=1, instances=2) is None


def test_a_batch_never_credited_back_is_forgotten() -> None:
    tracker = timed(batch_s=0.08)
    # Four batch times and a second after its send, its worker is taken for gone.
    assert tracker.hold_until(11.5, 11.499, 1, credits=1, instances=2) is None
    assert len(tracker) == 0


@pytest.fixture
def two_instance_entry(tiny_repository: Path, tmp_path: Path) -> ModelEntry:
    root = tmp_path / "models"
    shutil.copytree(tiny_repository / "tiny_mlp", root / "tiny_mlp")
    config_path = root / "tiny_mlp" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    config_path.write_text(yaml.safe_dump(config))
    return Repository.load(root).resolve("tiny_mlp")[0]


def request(number: int) -> Entry:
    fields = {wire.PAYLOAD: b"request %d" % number, wire.BATCH_SIZE: b"1"}
    return Entry("requests", b"%d-0" % number, fields)


async def test_a_lane_sends_at_once_when_idle_then_holds_beside_its_batch_in_flight(
    two_instance_entry: ModelEntry,
) -> None:
    """The lane's wiring, against a real Redis: sends and credits feed the tracker."""
    with private_redis() as server:
        redis = Redis.from_url(server.url)
        link = Link(server.url)
        try:
            group = StreamGroup(redis, names.BATCHER_GROUP, "test")
            lane = BatcherLane(link, group, two_instance_entry, "1", share_hold=0.25)
            lane.resync_credits(instances=2, workers_idle=True)  # as the upkeep finds them
            for number in range(3):
                lane.add(request(number), time.monotonic())
            wake_at, batch = lane._decide(time.monotonic())
            assert (wake_at, len(batch)) == (None, 3)  # every instance free: at once
            await lane._send(batch, [])
            assert (lane.credits, len(lane.in_flight)) == (1, 1)
            assert await redis.xlen(lane.batch_stream) == 1

            lane.in_flight.batch_s = 0.08  # as learned from earlier batches' credits
            arrived = time.monotonic()
            lane.add(request(3), arrived)
            wake_at, batch = lane._decide(arrived)
            assert batch == []  # one instance busy with 3 rows: the other waits for more
            assert wake_at == pytest.approx(arrived + 0.25 * 0.08)
            lane.add(request(4), arrived)
            lane.add(request(5), arrived)
            wake_at, batch = lane._decide(arrived)
            assert len(batch) == 3  # as many as the batch in flight: it goes

            lane.add_credit(Entry(lane.credit_stream, b"9-0", {wire.CREDITS: b"1"}))
            assert (lane.credits, len(lane.in_flight)) == (2, 0)
        finally:
            await link.close()
            await redis.aclose()
