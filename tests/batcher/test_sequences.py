"""The batcher's sequence book: one request of a sequence at a time, in arrival order.

The book is the lane's pure state; its Redis side (the lease that lets one batcher order a
model's sequences) runs against a real redis-server.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from batcher.policy import Queued
from batcher.sequences import Arrival, SequenceBook, SequenceLease
from weir import wire
from weir.redis_server import RedisServer

START, END = wire.SEQUENCE_START, wire.SEQUENCE_END


def item(number: int, sequence: str, flags: int = 0) -> Queued:
    return Queued(f"{number}-0".encode(), 1, b"", float(number), sequence=sequence, flags=flags)


def test_a_sequence_has_one_request_out_and_the_rest_wait_in_order() -> None:
    book = SequenceBook("m", "1", idle_s=10)
    first, second, third = item(1, "7", START), item(2, "7"), item(3, "7", END)
    other = item(4, "8", START)
    assert [book.arrive(i, 0.0) for i in (first, second, third, other)] == [
        Arrival.QUEUE, Arrival.WAIT, Arrival.WAIT, Arrival.QUEUE
    ]  # fmt: skip
    assert book.sent([first, other], []) == []
    assert book.waiting_ids() == [second.entry_id, third.entry_id]
    assert book.done(["7"], 1.0) == [second]  # the next joins the queue once "7" ran
    assert book.done(["7"], 1.0) == []  # a credit again (a batch run twice) frees nothing
    book.sent([second], [])
    assert book.done(["7"], 2.0) == [third]
    book.sent([third], [])
    assert book.done(["7"], 3.0) == []
    assert "7" not in book.busy and "7" not in book.open  # ended


def test_a_request_of_no_open_sequence_is_refused_in_tritons_words() -> None:
    book = SequenceBook("acc", "1", idle_s=10)
    lost = item(1, "'abc")
    assert book.arrive(lost, 0.0) is Arrival.REFUSE
    assert book.refusal(lost).message == (
        "inference request for sequence abc to model 'acc' must specify the START flag on "
        "the first request of the sequence"
    )


def test_a_request_answered_unrun_lets_the_next_go() -> None:
    book = SequenceBook("m", "1", idle_s=10)
    expired, after = item(1, "5", START), item(2, "5")
    book.arrive(expired, 0.0)
    book.arrive(after, 0.0)
    assert book.sent([], [expired]) == [after]


def test_an_idle_sequence_ends_and_its_state_goes_with_the_next_send() -> None:
    book = SequenceBook("m", "1", idle_s=1.0)
    book.arrive(item(1, "5", START), 0.0)
    book.arrive(item(2, "6", START), 0.0)
    assert book.commands([item(1, "5", START)]) == [("HSET", book.states_key, "5", b"")]
    book.sent([item(1, "5", START)], [])
    book.done(["5"], 0.5)
    book.sweep(1.2)  # "6" is queued: busy, so not idle; "5" answered at 0.5
    assert book.ended == []
    book.sweep(1.6)
    assert book.ended == ["5"] and "5" not in book.open
    assert book.commands([]) == [("HDEL", book.states_key, "5")]
    book.sent([], [])
    assert book.commands([]) == []


def test_one_batcher_at_a_time_holds_a_models_lease() -> None:
    async def run(url: str) -> None:
        redis = Redis.from_url(url)
        first = SequenceLease(redis, "batcher-a", ttl_s=0.3)
        second = SequenceLease(redis, "batcher-b", ttl_s=0.3)
        assert await first.hold("acc", "1")
        assert not await second.hold("acc", "1")
        assert await first.hold("acc", "1")  # renewed
        # Its holder stops renewing: within the lease's time to live the other takes it.
        deadline = asyncio.get_running_loop().time() + 5
        while not await second.hold("acc", "1"):
            assert asyncio.get_running_loop().time() < deadline, "the lease never lapsed"
            await asyncio.sleep(0.05)
        assert not await first.hold("acc", "1")
        await second.release("acc", "1")
        assert await first.hold("acc", "1")
        await redis.aclose()

    with RedisServer() as server:
        asyncio.run(run(server.url))
