"""The sequences of a sequence model's lane: open ones, and one request of each at a time.

Triton's sequence batcher, over the mesh. A request of a sequence joins the lane's queue only
when no other request of its sequence is queued or running: the rest wait behind it, in
arrival order, so a batch holds at most one request of a sequence and a request runs only
after the one before it has been written (its state with it, :mod:`workers.sequences`). A
worker's credit names the sequences whose requests its batch ran; each one's next request
then joins the queue.

A request that does not start a sequence (``sequence_start``) must belong to an open one,
or it is refused with Triton's words. A sequence ends with its ``sequence_end`` request, or
when no request of it arrived for ``max_sequence_idle_microseconds`` and none is queued or
running: its state is dropped with the lane's next send.

The open sequences are also the fields of the model's sequence hash in Redis (written on a
start, dropped at the end), so a batcher that takes over a lane knows them. One batcher at a
time batches a sequence model (:class:`SequenceLease`): order is kept in one place.
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum

from redis.asyncio import Redis

from batcher.policy import Queued
from weir import names, wire
from weir.errors import InvalidInput
from weir.redis_io.link import Command

SWEEP_S = 0.25  # the longest between looks for idle sequences


class Arrival(StrEnum):
    """What the lane does with a sequence's request."""

    QUEUE = "queue"  # into the batch queue now
    WAIT = "wait"  # behind its sequence's request queued or running
    REFUSE = "refuse"  # no open sequence and no start: answered with an error


class SequenceBook:
    """Open sequences, those with a request queued or running, and the requests behind."""

    def __init__(self, model: str, version: str, idle_s: float) -> None:
        self.model = model
        self.states_key = names.sequence_states(model, version)
        self.idle_s = idle_s
        self.open: dict[str, float] = {}  # key -> last request or answer (monotonic)
        self.busy: set[str] = set()  # a request queued or running
        self.running: set[str] = set()  # a request sent in a batch, its credit not yet back
        self.waiting: dict[str, deque[Queued]] = {}
        self.ended: list[str] = []  # ended idle: their state goes with the next send
        self.next_sweep_s = 0.0

    def arrive(self, item: Queued, now_s: float) -> Arrival:
        key = item.sequence
        if not item.flags & wire.SEQUENCE_START and key not in self.open:
            return Arrival.REFUSE
        if item.flags & wire.SEQUENCE_END:
            self.open.pop(key, None)
        else:
            self.open[key] = now_s
        if key in self.busy:
            self.waiting.setdefault(key, deque()).append(item)
            return Arrival.WAIT
        self.busy.add(key)
        return Arrival.QUEUE

    def refusal(self, item: Queued) -> InvalidInput:
        shown = item.sequence.removeprefix("'")
        return InvalidInput(
            f"inference request for sequence {shown} to model '{self.model}' must specify "
            "the START flag on the first request of the sequence"
        )

    def sent(self, batch: list[Queued], answered: list[Queued]) -> list[Queued]:
        """A send was written: its batch's requests run, the answered ones left the queue.

        Returns the requests that now join the queue (behind those answered unrun).
        """
        self.ended = []
        for item in batch:
            if item.sequence:
                self.running.add(item.sequence)
        return [
            ready for item in answered if item.sequence for ready in self.release(item.sequence)
        ]

    def done(self, keys: list[str], now_s: float) -> list[Queued]:
        """Batches that ran these sequences' requests were written: their next ones, to queue."""
        ready: list[Queued] = []
        for key in keys:
            if key in self.running:
                self.running.discard(key)
                if key in self.open:
                    self.open[key] = now_s
                ready.extend(self.release(key))
        return ready

    def all_done(self, now_s: float) -> list[Queued]:
        """Every worker is idle: nothing sent is still running (a credit may have been lost)."""
        return self.done(list(self.running), now_s)

    def release(self, key: str) -> list[Queued]:
        """The sequence's request left the queue or ran: its next one, if any, to queue."""
        behind = self.waiting.get(key)
        if not behind:
            self.waiting.pop(key, None)
            self.busy.discard(key)
            return []
        item = behind.popleft()
        if not behind:
            del self.waiting[key]
        return [item]

    def waiting_ids(self) -> list[bytes]:
        return [item.entry_id for behind in self.waiting.values() for item in behind]

    def sweep(self, now_s: float) -> None:
        """End the open sequences idle too long with nothing queued or running."""
        if now_s < self.next_sweep_s:
            return
        self.next_sweep_s = now_s + min(SWEEP_S, self.idle_s / 4)
        idle = [
            key
            for key, last_s in self.open.items()
            if key not in self.busy and now_s - last_s >= self.idle_s
        ]
        for key in idle:
            del self.open[key]
        self.ended.extend(idle)

    def wake_s(self) -> float | None:
        """When to look for idle sequences again; None with none open."""
        return self.next_sweep_s if self.open else None

    def commands(self, batch: list[Queued]) -> list[Command]:
        """What a send records with ``batch``: sequences ended idle, and those it starts.

        A start is written with its batch, before the worker can write the state it makes.
        """
        commands: list[Command] = []
        ended = [key for key in self.ended if key not in self.open]
        if ended:
            commands.append(("HDEL", self.states_key, *ended))
        started = [q.sequence for q in batch if q.sequence and q.flags & wire.SEQUENCE_START]
        if started:
            pairs = [part for key in started for part in (key, b"")]
            commands.append(("HSET", self.states_key, *pairs))
        return commands

    async def recover(self, redis: Redis, now_s: float) -> None:
        """The sequences open in Redis (another batcher's, or this one's before a restart)."""
        keys = await redis.hkeys(self.states_key)
        for key in keys:
            self.open.setdefault(key.decode() if isinstance(key, bytes) else str(key), now_s)


# KEYS: the lease. ARGV: the batcher, the lease's time to live (ms). 1: the batcher holds it.
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class SequenceLease:
    """Which batcher batches a sequence model: the one holding its lease, renewed in upkeep.

    A request stream is shared by every batcher's consumer group; a sequence model's requests
    must be ordered in one place, so only the lease holder reads its request and credit
    streams. A batcher that dies stops renewing; after ``ttl_s`` another takes the lease, and
    the requests the dead one held pending are claimed as any dead batcher's are.
    """

    def __init__(self, redis: Redis, consumer: str, ttl_s: float) -> None:
        self.redis = redis
        self.consumer = consumer
        self.ttl_ms = max(int(ttl_s * 1000), 1)

    async def hold(self, model: str, version: str) -> bool:
        key = names.sequence_lease(model, version)
        held = await self.redis.eval(_LEASE, 1, key, self.consumer, self.ttl_ms)
        return bool(held == 1)

    async def release(self, model: str, version: str) -> None:
        key = names.sequence_lease(model, version)
        script = "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end"
        await self.redis.eval(script, 1, key, self.consumer)
