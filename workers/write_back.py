"""What a worker writes once a batch has run, or cannot run: the write-back of one lane.

One pipeline writes every reply of a batch (and a pipeline's next steps) and, in a
transaction after them, records the batch's counters and statistics, returns a credit to
the batchers and acks the batch (weir.stages): a batch is acked only after everything it
produced is written, and the whole is retried while Redis is down. A batch delivered too
often, or that cannot be processed, is dead-lettered in that same transaction and each of
its requests answered with an error, so a poison input cannot crash-loop a pool.

The statistics follow Triton's: executions, inferences and batch statistics count
successful backend calls; a request's success or fail time runs from the gateway taking it
to its batch being recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from redis.exceptions import RedisError

from pipelines.route import Router
from weir import names, stages, wire
from weir.errors import ServerError, WeirError
from weir.redis_io.link import Command, HotLink
from weir.redis_io.retry import RetryWait
from weir.repository import ModelEntry
from weir.settings import WorkerSettings
from weir.stats import (
    COMPUTE_PHASES,
    REQUEST_PHASES,
    Field,
    Stamp,
    batch_phase_field,
    batch_size_field,
    outcome_fields,
    phase_field,
)
from weir.streams import Entry, StreamGroup
from weir.wire import InferReply, InferRequest
from workers.execution import Execution

logger = logging.getLogger(__name__)


# KEYS: the statistics hash. ARGV: the batch's last_inference (unix ms, 0 for none), then
# field, increment, field, increment ... last_inference only ever moves forward.
_ADD_STATS = """
local last = tonumber(ARGV[1])
if last > tonumber(redis.call('HGET', KEYS[1], 'last_inference') or '0') then
  redis.call('HSET', KEYS[1], 'last_inference', ARGV[1])
end
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
"""


class Outcome:
    """What one batch produced, ready to write."""

    __slots__ = (
        "answered", "compute_cpu_ns", "compute_ns", "executions", "forwards",
        "last_inference_ms", "phases", "replies", "routed", "sequence_commands", "sequence_keys",
    )  # fmt: skip

    def __init__(self) -> None:
        self.replies: list[tuple[str, bytes]] = []
        self.executions: list[Execution] = []
        self.compute_ns = 0  # wall time
        self.compute_cpu_ns = 0  # CPU time of the thread that ran the batch
        self.answered = 0
        self.last_inference_ms = 0  # when a backend call of the batch last succeeded
        # Per request, summed: success/fail counts and nanoseconds, queue and compute time.
        self.phases: dict[str, int] = {}
        # Pipeline steps that finished, and the step requests they lead to.
        self.routed: list[tuple[InferRequest, InferReply]] = []
        self.forwards: list[tuple[InferRequest, int]] = []
        # A sequence model's: its states kept (workers.sequences), the sequences it ran.
        self.sequence_commands: list[Command] = []
        self.sequence_keys: list[str] = []


class WriteBack:
    """Writes the effects of one (model, version)'s batches and acks them.

    Args:
        link: the worker's hot-path link, for transactions (they never block).
        group: the stream group the batches are read with, to ack them.
        entry: the model served.
        version: its version served.
        router: routes finished pipeline steps; the worker swaps it when pipelines change.
        settings: the worker's settings.
        label: names the lane in logs.
    """

    def __init__(
        self,
        link: HotLink,
        group: StreamGroup,
        entry: ModelEntry,
        version: str,
        router: Router,
        settings: WorkerSettings,
        label: str,
    ) -> None:
        self.link = link
        self.group = group
        self.entry = entry
        self.version = version
        self.router = router
        self.settings = settings
        self.label = label
        self.stream = names.batch_stream(entry.name, version)
        self.stats_key = names.model_stats(entry.name, version)
        self.credit_stream = names.credit_stream(entry.name, version)

    def credit(self, instances: int, sequences: list[str] | None = None) -> Command:
        """The command that gives the batchers a credit of ``instances`` free slots.

        A sequence model's also names the sequences whose requests the batch ran.
        """
        if sequences:
            ran = wire.encode_keys(sequences)
            return ("XADD", self.credit_stream, "*", wire.CREDITS, instances, wire.SEQUENCES, ran)
        return ("XADD", self.credit_stream, "*", wire.CREDITS, instances)

    async def write(self, entry_id: bytes, outcome: Outcome, dead: Command | None = None) -> None:
        """Write a batch's effects and ack it in one transaction, retrying while Redis is down."""
        retry = RetryWait()
        while True:
            try:
                if outcome.routed:
                    effects = await self.router.advance(outcome.routed)
                    outcome.routed = []
                    outcome.replies.extend(effects.replies)
                    outcome.forwards.extend(effects.requests)
                outside, inside = self._effects(entry_id, outcome)
                if dead is not None:
                    inside.insert(0, dead)
                await stages.effects(self.link, outside, inside)
                return
            except RedisError as exc:
                logger.warning("writing replies of %s failed, retrying: %s", self.label, exc)
                await retry.failed()

    def _effects(self, entry_id: bytes, outcome: Outcome) -> tuple[list[Command], list[Command]]:
        """The batch's effects on other slots (replies, forwards), and on its model's."""
        outside = stages.answer(outcome.replies, self.settings.reply_maxlen)
        outside.extend(stages.forward(request, batch) for request, batch in outcome.forwards)
        commands: list[Command] = []
        increments = _stat_increments(outcome)
        if increments:
            # EVAL, not EVALSHA: inside MULTI a script missing from a restarted Redis's cache
            # would fail alone and the rest of the transaction would still commit.
            last = outcome.last_inference_ms
            commands.append(("EVAL", _ADD_STATS, 1, self.stats_key, last, *increments))
        commands.extend(outcome.sequence_commands)
        commands.append(stages.settle(self.entry.name, self.version, outcome.answered))
        commands.append(self.credit(1, outcome.sequence_keys))
        commands.append(self.group.ack(self.stream, [entry_id]))
        return outside, commands

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        """Park a batch on the dead-letter stream; answer each request with a 500."""
        outcome, dead = self._dead(entry, reason)
        await self.write(entry.id, outcome, dead)

    def dead_letter_commands(
        self, entry: Entry, reason: str
    ) -> tuple[list[Command], list[Command]]:
        """:meth:`dead_letter`'s commands, for a thread whose event loop is busy.

        The 500 replies (on other slots), then what runs in one transaction on the model's.
        """
        outcome, dead = self._dead(entry, reason)
        outside, inside = self._effects(entry.id, outcome)
        return outside, [dead, *inside]

    def _dead(self, entry: Entry, reason: str) -> tuple[Outcome, Command]:
        payload = entry.fields.get(wire.PAYLOAD, b"")
        outcome = Outcome()
        error = ServerError(
            f"batch of model '{self.entry.name}' version '{self.version}' "
            f"was dead-lettered: {reason}"
        )
        try:
            requests = decode_requests(entry)
        except Exception:
            requests = []
            logger.error("dead-lettered batch %s of %s is undecodable", entry.id, self.label)
        for request in requests:
            outcome.replies.append((request.reply_to, failure_reply(request, error)))
        outcome.answered = len(requests)
        outcome.sequence_keys = list(dict.fromkeys(r.sequence_key for r in requests if r.sequence))
        outcome.sequence_commands = ended_sequences(self.entry.name, self.version, requests)
        outcome.phases = phase_totals([], {}, requests, wire.now_ns())
        logger.error("dead-lettering batch %s of %s: %s", entry.id, self.label, reason)
        return outcome, stages.dead_letter(self.entry.name, self.version, payload, reason, entry.id)


def ended_sequences(model: str, version: str, requests: list[InferRequest]) -> list[Command]:
    """Drop the state of the sequences that ``requests`` end, though they could not run."""
    ended = [r.sequence_key for r in requests if r.sequence and r.sequence[1] & wire.SEQUENCE_END]
    return [("HDEL", names.sequence_states(model, version), *ended)] if ended else []


def decode_requests(entry: Entry) -> list[InferRequest]:
    """The requests of a batch entry; a WeirError when it cannot be decoded."""
    try:
        return [InferRequest.decode(p) for p in wire.decode_batch(entry.fields[wire.PAYLOAD])]
    except (KeyError, ValueError, TypeError) as exc:
        raise WeirError(f"undecodable batch: {exc}") from exc


def failure_reply(request: InferRequest, error: WeirError) -> bytes:
    """An error reply; a pipeline step's goes to the pipeline request it serves."""
    reply = InferReply.failure(request, error)
    if request.route is not None:
        reply.id = str(request.route["request_id"])
        error_message = (
            f"pipeline '{request.route['pipeline']}' step {request.route['step']} "
            f"(model '{request.model}' version {request.version}): {error.message}"
        )
        reply.error = (error.kind, error_message)
    return reply.encode()


def phase_totals(
    replies: list[InferReply],
    requests: Mapping[str, InferRequest],
    failed: list[InferRequest],
    end_ns: int,
) -> dict[str, int]:
    """Counts and summed nanoseconds of each phase over a batch's replies.

    As Triton: a request's success or fail time runs from the gateway taking it to
    ``end_ns``, when its batch is recorded; ``failed`` are requests answered without a run.
    """
    totals: dict[str, int] = {}
    for reply in replies:
        _add_request(totals, reply.error is None, requests[reply.id], end_ns)
        if reply.error is None:
            _add_phases(totals, reply.ts)
    for request in failed:
        _add_request(totals, False, request, end_ns)
    return {k: v for k, v in totals.items() if v}


def _stat_increments(outcome: Outcome) -> list[str | int]:
    """Field, increment, field, increment ... for the model's statistics hash.

    As Triton: executions, inferences and batch statistics count successful backend calls.
    """
    counts: dict[str, int] = {}
    for execution in outcome.executions:
        if execution.phases_ns is not None:
            _count_execution(counts, execution.batch_size, execution.phases_ns)
    if outcome.executions:
        counts[Field.COMPUTE_NS] = outcome.compute_ns
    counts.update(outcome.phases)
    return [item for pair in counts.items() for item in pair]


def _count_execution(counts: dict[str, int], size: int, phases_ns: tuple[int, ...]) -> None:
    increments = {Field.EXECUTION_COUNT: 1, Field.INFERENCE_COUNT: size, batch_size_field(size): 1}
    for phase, ns in zip(COMPUTE_PHASES, phases_ns, strict=True):
        increments[batch_phase_field(phase, size)] = ns
    for key, increment in increments.items():
        counts[key] = counts.get(key, 0) + increment


def _add_request(
    totals: dict[str, int], succeeded: bool, request: InferRequest, end_ns: int
) -> None:
    count, ns = outcome_fields(succeeded)
    totals[count] = totals.get(count, 0) + 1
    if Stamp.GATEWAY_IN in request.ts:
        waited = max(end_ns - request.ts[Stamp.GATEWAY_IN], 0)
        totals[ns] = totals.get(ns, 0) + waited


def _add_phases(totals: dict[str, int], ts: Mapping[str, int]) -> None:
    for start, end, key in _PHASE_FIELDS:
        if start in ts and end in ts:
            totals[key] = totals.get(key, 0) + max(ts[end] - ts[start], 0)


# Each request phase's stamps and statistics field, worked out once.
_PHASE_FIELDS = [(phase.start, phase.end, phase_field(phase)) for phase in REQUEST_PHASES]
