"""One (model, version) in the batcher: its queue, its credits and its dispatcher.

Credits are free worker instances: each worker announces its instances when it starts and
one more each time it finishes a batch; the lane spends one per batch it sends. While the
lane holds credits it sends what is queued at once (work-conserving); without, it follows
Triton's rule. Each send is one pipeline: the error replies for requests whose deadline
passed in the queue, then one transaction of the batch and the acks of everything they
consumed (weir.stages). Requests whose
client left (:mod:`weir.cancels`) are dropped unbatched: acked and counted as failures,
with no reply, since nobody waits for one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from redis.exceptions import RedisError

from batcher import free_instance
from batcher.in_flight import InFlight
from batcher.policy import BatchQueue, Queued
from batcher.sequences import Arrival, SequenceBook
from batcher.wake import Wake
from weir import names, stages, wire
from weir.errors import DeadlineExceeded, WeirError
from weir.redis_io.link import Command, HotLink
from weir.redis_io.retry import RetryWait
from weir.repository import ModelEntry
from weir.stats import Field
from weir.streams import Entry, StreamGroup
from weir.wire import InferReply

logger = logging.getLogger(__name__)

MAX_UNACKED_CREDITS = 256


class BatcherLane:
    """The queue and the dispatcher of one (model, version)."""

    def __init__(
        self,
        link: HotLink,
        group: StreamGroup,
        entry: ModelEntry,
        version: str,
        work_conserving: bool = True,
        busy_hold_s: float = 1.0,
        is_canceled: Callable[[str], bool] | None = None,
        free_probe_s: float = 0.002,
        share_hold: float = 0.0,
    ) -> None:
        self.link = link  # shared by the lanes: their transactions never block
        self.group = group
        self.model = entry.name
        self.version = version
        self.stamp = entry.stamp(version)  # the config it batches by (model control)
        self.request_stream = names.request_stream(entry.name, version)
        self.batch_stream = names.batch_stream(entry.name, version)
        self.credit_stream = names.credit_stream(entry.name, version)
        self.stats_key = names.model_stats(entry.name, version)
        self.cancel_stream = names.cancel_stream(entry.name, version)
        self.queue = _queue_for(entry)
        self.batches = entry.config.max_batch_size > 0
        self.credits = 0
        self.credit_ids: list[bytes] = []
        self.sending: set[bytes] = set()  # taken from the queue, not yet acked
        self.work_conserving = work_conserving
        self.busy_hold_s = busy_hold_s
        self.wake = Wake()
        self.stopping = False  # send what is held, then end (see stop)
        self.is_canceled = is_canceled or _never
        self.dropped: list[Queued] = []  # cancelled: to ack with the next send
        self.recheck = False  # a cancel notice came: look through the queue
        self.send_retry = RetryWait()  # after a send Redis refused
        # Other batchers share the request stream: a credit may be with one of them
        # (batcher.free_instance). The live instances bound what a probe calls free.
        self.siblings = False
        self.instances = 0
        self.free_probe_s = free_probe_s
        self.next_probe_s = 0.0
        # Batches sent and not yet credited back: a free instance beside them waits a
        # little for a batch of their size (batcher.in_flight).
        self.in_flight = InFlight(share_hold)
        sequencing = entry.config.sequence_batching
        self.book = SequenceBook(self.model, version, sequencing.idle_s) if sequencing else None
        self.refused: list[tuple[Queued, WeirError]] = []  # answered with an error, unbatched

    def noticed(self) -> None:
        """A cancel notice for this lane came: drop what it names at the next turn."""
        self.recheck = True
        self.wake.set()

    def add(self, entry: Entry, now_s: float) -> None:
        fields = entry.fields
        item = Queued(
            entry.id,
            int(fields.get(wire.BATCH_SIZE, b"1")) if self.batches else 1,
            fields[wire.PAYLOAD],
            now_s,
            int(fields.get(wire.DEADLINE, b"0")),
            int(fields.get(wire.PRIORITY, b"0")),
            fields.get(wire.REQUEST_ID, b"").decode(),
            fields.get(wire.REPLY_TO, b"").decode(),
            fields.get(wire.SEQUENCE, b"").decode(),
            int(fields.get(wire.SEQUENCE_FLAGS, b"0")),
            int(fields.get(wire.DELAY_AT, b"0")),
            wire.LEVEL_COUNTED in fields,
        )
        arrival = self.book.arrive(item, now_s) if self.book and item.sequence else Arrival.QUEUE
        if arrival is Arrival.QUEUE:
            self._enqueue(item)
        elif arrival is Arrival.REFUSE and self.book is not None:
            self.refused.append((item, self.book.refusal(item)))
        self.wake.set()

    def _enqueue(self, item: Queued) -> None:
        if self.is_canceled(item.request_id):  # its notice came first
            self.dropped.append(item)
        else:
            self.queue.add(item)

    def adopt_credits(self, old: BatcherLane) -> None:
        """Take over the credits of the lane this one replaces (a new config's)."""
        self.credits, old.credits = old.credits, 0
        self.credit_ids, old.credit_ids = old.credit_ids, []
        self.in_flight = old.in_flight
        if self.book is not None and old.book is not None:  # the same sequences go on
            old.book.idle_s = self.book.idle_s
            self.book = old.book
        self.wake.set()

    def add_credit(self, entry: Entry) -> None:
        credits = int(entry.fields.get(wire.CREDITS, b"1"))
        self.credits += credits
        self.in_flight.credited(time.monotonic(), credits)
        self.credit_ids.append(entry.id)
        ran = entry.fields.get(wire.SEQUENCES)
        if ran and self.book is not None:
            for item in self.book.done(wire.decode_keys(ran), time.monotonic()):
                self._enqueue(item)
        self.wake.set()

    def _decide(self, now_s: float) -> tuple[float | None, list[Queued]]:
        """When to look again, and the batch to send now (possibly empty).

        A worker idle: work-conserving sends what is queued at once, the plain rule waits out
        the delay. Every worker busy: only full batches go ahead, and the rest waits for a
        credit (the queue keeps growing into a bigger batch), at most ``busy_hold_s``.
        """
        oldest = self.queue.oldest_s()
        if oldest is None:
            return None, []
        if self.credits > 0:
            if self.work_conserving:
                hold_s = self.in_flight.hold_until(
                    now_s, oldest, self.queue.rows(), self.credits, self.instances
                )
                if hold_s is None:
                    return None, self.queue.take(now_s, eager=True)
                return hold_s, self.queue.take(now_s, full_only=True)
            return oldest + self.queue.max_queue_delay_s, self.queue.take(now_s)
        if now_s >= oldest + self.busy_hold_s:
            return None, self.queue.take(float("inf"))
        return oldest + self.busy_hold_s, self.queue.take(now_s, full_only=True)

    def held(self) -> set[bytes]:
        """Every entry this lane has read and not yet acked."""
        queued = (item.entry_id for level in self.queue.levels for item in level)
        dropped = (item.entry_id for item in self.dropped)
        refused = (item.entry_id for item, _ in self.refused)
        waiting = self.book.waiting_ids() if self.book else []
        return {*queued, *dropped, *refused, *waiting, *self.credit_ids, *self.sending}

    def resync_credits(self, instances: int, workers_idle: bool) -> None:
        """Bring the credits back in line with the live instances.

        Never more than the live instances (a dead worker's credits expire); all of them
        when the batch stream shows every worker idle (credits lost, say while Redis was
        down, come back). No live instance seen at all may be a heartbeat gap: no change.
        """
        if instances <= 0:
            return
        self.instances = instances
        self.credits = min(self.credits, instances)
        if workers_idle:
            self.credits = max(self.credits, instances)
            self.in_flight.clear()
            for item in self.book.all_done(time.monotonic()) if self.book else []:
                self._enqueue(item)

    async def dispatch(self) -> None:
        """Send batches as the rule lets them leave, until stopped and empty."""
        wake_at: float | None = None
        sent = False
        while not (self.stopping and not self.queue and not self.dropped and not self.refused):
            if not sent:  # after a batch, look again at once: more may be ready
                await self._wait(wake_at)
            # Cleared before the state is read: whatever arrives from here on wakes us again.
            self.wake.clear()
            expired = self.queue.drop_expired(time.time() * 1000)
            expired.extend(self._take_dropped())
            if self.book is not None:
                self.book.sweep(time.monotonic())
            if self.stopping:
                # Leaving: what is queued goes now rather than waiting for anything.
                wake_at, batch = None, self.queue.take(float("inf"))
            else:
                wake_at, batch = self._decide(time.monotonic())
                if not batch and self._may_probe():
                    wake_at, batch = await self._probe(wake_at)
                wake_at = _earliest(wake_at, self.book.wake_s() if self.book else None)
            # Credits are acked with the next batch: no round trip of their own.
            if batch or expired or self._records() or len(self.credit_ids) >= MAX_UNACKED_CREDITS:
                await self._send(batch, expired)
            sent = bool(batch)

    def _records(self) -> bool:
        """Refusals to answer, or sequences ended idle: a send even without a batch."""
        return bool(self.refused) or (self.book is not None and bool(self.book.ended))

    def _may_probe(self) -> bool:
        """Requests held, no credit, and a sibling batcher that may hold the one wanted."""
        return self.siblings and self.work_conserving and self.credits <= 0 and bool(self.queue)

    async def _probe(self, wake_at: float | None) -> tuple[float | None, list[Queued]]:
        """What is queued, when the batch stream shows an instance free; else when to ask again.

        At most one probe per ``free_probe_s``; a probe Redis refuses counts as no instance
        free (the credits and ``busy_hold_s`` still rule).
        """
        now_s = time.monotonic()
        if now_s >= self.next_probe_s:
            self.next_probe_s = now_s + self.free_probe_s
            command = free_instance.probe(self.batch_stream, self.instances)
            try:
                (free,) = await self.link.call(command)
            except RedisError:
                free = 0
            if free == 1:
                return None, self.queue.take(time.monotonic(), eager=True)
        return min(self.next_probe_s, wake_at or self.next_probe_s), []

    def _take_dropped(self) -> list[Queued]:
        """The requests whose client left, out of the queue (marked: no reply to send)."""
        if self.recheck:
            self.recheck = False
            self.dropped.extend(self.queue.remove_if(lambda q: self.is_canceled(q.request_id)))
        dropped, self.dropped = self.dropped, []
        return [replace(item, reply_to="") for item in dropped]

    async def _wait(self, wake_at: float | None) -> None:
        timeout = None if wake_at is None else max(wake_at - time.monotonic(), 0.0)
        if self.stopping or timeout == 0.0 or self.wake.is_set():
            return
        await self.wake.wait(timeout)

    def stop(self) -> None:
        """The dispatcher sends what the lane holds, at once, and ends."""
        self.stopping = True
        self.wake.set()

    async def _send(self, batch: list[Queued], expired: list[Queued]) -> None:
        credit_ids, self.credit_ids = self.credit_ids, []
        refused, self.refused = self.refused, []
        unrun = [*expired, *(item for item, _ in refused)]
        self.sending = {q.entry_id for q in (*batch, *unrun)}.union(credit_ids)
        commands: list[Command] = self.book.commands(batch) if self.book else []
        if batch:
            payload = wire.encode_batch([q.payload for q in batch])
            commands.append(stages.publish(self.model, self.version, payload))
        timed_out = DeadlineExceeded(DeadlineExceeded.TRITON_TEXT)  # queued too long, as Triton
        replies = [(q.reply_to, self._error_reply(q, timed_out)) for q in expired if q.reply_to]
        replies += [(q.reply_to, self._error_reply(q, error)) for q, error in refused]
        if unrun:
            commands.append(stages.settle(self.model, self.version, len(unrun)))
            commands.extend(self._count_failed(unrun))
        commands.extend(stages.unqueue(self.model, self.version, _counted(batch, unrun)))
        consumed = [q.entry_id for q in (*batch, *unrun)]
        if consumed:
            commands.append(self.group.ack(self.request_stream, consumed))
        if credit_ids:
            commands.append(self.group.ack(self.credit_stream, credit_ids))
        try:
            # The expired requests' answers go to gateways' streams, on other cluster slots.
            await stages.effects(self.link, stages.answer(replies), commands)
        except RedisError as exc:
            logger.warning("sending a batch of %s failed, keeping it: %s", self.model, exc)
            self.queue.restore([*batch, *expired])
            self.refused[:0] = refused
            self.credit_ids[:0] = credit_ids
            self.sending = set()
            await self.send_retry.failed()
            return
        self.send_retry.succeeded()
        self.sending = set()
        for item in self.book.sent(batch, expired) if self.book else []:
            self._enqueue(item)
        if batch:
            self.credits -= 1
            self.in_flight.sent(time.monotonic(), sum(q.size for q in batch))

    def _count_failed(self, expired: list[Queued]) -> list[Command]:
        """Expired requests count as failures in the model's statistics, as Triton's do.

        Their time is what they waited in the batcher (the hop before it is not known here).
        """
        waited_ns = sum(int((time.monotonic() - q.arrived_s) * 1e9) for q in expired)
        return [
            ("HINCRBY", self.stats_key, Field.FAIL_COUNT, len(expired)),
            ("HINCRBY", self.stats_key, Field.FAIL_NS, max(waited_ns, 0)),
        ]

    def _error_reply(self, item: Queued, error: WeirError) -> bytes:
        reply = InferReply(
            item.request_id, self.model, self.version, error=(error.kind, error.message)
        )
        return reply.encode()


def _counted(*groups: list[Queued]) -> dict[int, int]:
    """How many of the requests were counted in each level's queue."""
    levels: dict[int, int] = {}
    for group in groups:
        for item in group:
            if item.counted:
                levels[item.level] = levels.get(item.level, 0) + 1
    return levels


def _earliest(first: float | None, second: float | None) -> float | None:
    if first is None or second is None:
        return second if first is None else first
    return min(first, second)


def _never(_: str) -> bool:
    return False


def _queue_for(entry: ModelEntry) -> BatchQueue:
    sequencing = entry.config.sequence_batching
    if sequencing is not None:  # its strategy's sizes and delay, one request per sequence
        return BatchQueue(
            entry.config.max_batch_size,
            sequencing.preferred_batch_size,
            sequencing.max_queue_delay_microseconds / 1e6,
        )
    batching = entry.config.dynamic_batching
    if batching is None:
        # Without dynamic_batching every request is its own batch, as Triton's default scheduler.
        return BatchQueue(1)
    return BatchQueue(
        entry.config.max_batch_size,
        batching.preferred_batch_size,
        batching.max_queue_delay_microseconds / 1e6,
        batching.priority_levels,
        batching.delays,
    )
