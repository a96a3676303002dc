"""The commands each stage of the mesh sends, built in one place.

A request's life in Redis: the gateway queues it on its model's request stream and counts it
in the model's queued counter (:func:`queue`); the batcher publishes batches on the model's
batch stream (:func:`publish`); a worker (or the batcher, for a request that expired in its
queue) answers it on the gateway's reply stream (:func:`answer`) and settles the counter
(:func:`settle`); a pipeline step's outputs queue the next steps' requests (:func:`queue`
again); a batch that cannot run is parked (:func:`dead_letter`). Every stage builds its
commands here, so the keys each command touches, and the Redis Cluster slots they lie on,
are written down once.

A model's keys share its hash tag (weir.names), so queueing, settling, statistics, credits
and acks of one model are on one slot, and :func:`effects` runs them in one MULTI. Replies
go to gateways' streams and forwards to other models' streams, on other slots: they are
sent first, in the same pipeline, outside the transaction. A stage that dies between the
two has not acked, so its batch is delivered again and its replies written again; the
gateway answers each request once and drops the copy, and a pipeline step claims each
start with a token (pipelines.route), so a repeated forward starts nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from weir import names, wire
from weir.redis_io.link import Arg, Command, HotLink, raise_errors

# KEYS: counter, stream, the model's serving set, its priority levels' counts. ARGV: the
# version to find in the serving set ('' : no check), then for each entry its max_queue_size
# (0: unbounded), its priority level and that level's own max_queue_size (0: none, and not
# counted in its level), its number of field/value arguments, then those. Returns, per
# entry, 1 when it was added, 0 when the model's queue was full, -3 when its level's was, and
# -1 when the version admits nothing (it is being unloaded).
# (Not the counter itself: replies to requests queued before a Redis restart can take it
# below zero, and a negative count is no refusal.)
QUEUE_SCRIPT = """
local results = {}
local at = 2
local closed = ARGV[1] ~= '' and redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 0
while at <= #ARGV do
  local limit = tonumber(ARGV[at])
  local level = ARGV[at + 1]
  local level_limit = tonumber(ARGV[at + 2])
  local count = tonumber(ARGV[at + 3])
  local first = at + 4
  at = first + count
  if closed then
    results[#results + 1] = -1
  elseif limit > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') >= limit then
    results[#results + 1] = 0
  elseif level_limit > 0 and tonumber(redis.call('HGET', KEYS[4], level) or '0') >= level_limit then
    results[#results + 1] = -3
  else
    redis.call('XADD', KEYS[2], '*', unpack(ARGV, first, at - 1))
    redis.call('INCR', KEYS[1])
    if level_limit > 0 then redis.call('HINCRBY', KEYS[4], level, 1) end
    results[#results + 1] = 1
  end
end
return results
"""


# KEYS[1]: the reply stream. An entry added and trimmed at once leaves an empty stream; on
# a stream that exists it would trim unread replies, hence the check in the same script.
ENSURE_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', 0, '*', 'created', '1')
end
"""


def ensure_stream(stream: str) -> Command:
    """Make a reply stream exist (empty), unless it does: replies never create one."""
    return ("EVAL", ENSURE_SCRIPT, 1, stream)


def entry_args(
    fields: Mapping[bytes, Arg], max_queue_size: int, level: int = 0, level_limit: int = 0
) -> list[Arg]:
    """One entry's arguments to :func:`queue`: its limits, then its fields.

    ``level_limit``: its priority level's own ``max_queue_size`` (0: none); an entry counted
    in its level carries ``wire.LEVEL_COUNTED``, for the batcher to take it off (:func:`unqueue`).
    """
    args: list[Arg] = [max_queue_size, level, level_limit, 2 * len(fields)]
    for key, value in fields.items():
        args.extend((key, value))
    return args


def queue(model: str, version: str, entries: Iterable[Arg], check_version: str = "") -> Command:
    """Queue requests on a model's stream and count them, each unless its queue is full.

    ``entries``: the :func:`entry_args` of each, concatenated. With ``check_version``,
    nothing is queued unless that version is in the model's serving set. The EVAL (not
    EVALSHA) needs no script cache: nothing to recover after a Redis restart, and Redis
    caches the compiled script by its hash anyway.
    """
    keys = (
        names.queued_counter(model, version),
        names.request_stream(model, version),
        names.serving_versions(model),
        names.level_counts(model, version),
    )
    return ("EVAL", QUEUE_SCRIPT, 4, *keys, check_version, *entries)


def unqueue(model: str, version: str, levels: Mapping[int, int]) -> list[Command]:
    """Take requests that left the batcher's queue off their levels' counts."""
    key = names.level_counts(model, version)
    return [("HINCRBY", key, level, -count) for level, count in levels.items()]


def forward(request: wire.InferRequest, batch: int) -> Command:
    """Queue a pipeline step's request on its model, past the queue limit (it is admitted)."""
    fields = wire.request_fields(request, batch)
    return queue(request.model, request.version, entry_args(fields, 0))


def publish(model: str, version: str, payload: bytes) -> Command:
    """Publish one formed batch (its requests, encoded) on the model's batch stream."""
    return ("XADD", names.batch_stream(model, version), "*", wire.PAYLOAD, payload)


def dead_letter(model: str, version: str, payload: bytes, reason: str, batch_id: bytes) -> Command:
    """Park a batch on the model's dead-letter stream, with why and its batch entry's id."""
    stream = names.dead_letter_stream(model, version)
    return ("XADD", stream, "*", wire.PAYLOAD, payload, b"reason", reason.encode(), b"id", batch_id)


def answer(replies: Iterable[tuple[str, bytes]], maxlen: int = 0) -> list[Command]:
    """Write ``(reply stream, encoded reply)`` pairs: one entry per gateway's stream.

    ``NOMKSTREAM``: a reply never creates a stream, so the stream of a gateway that stopped
    stays gone however late a reply comes. ``maxlen`` (0: none) caps the stream, roughly.
    """
    cap: tuple[Arg, ...] = ("MAXLEN", "~", maxlen) if maxlen else ()
    return [
        ("XADD", stream, "NOMKSTREAM", *cap, "*", *_flat(fields))
        for stream, fields in wire.reply_entries(replies).items()
    ]


def settle(model: str, version: str, answered: int) -> Command:
    """Take ``answered`` requests off the model's queued counter."""
    return ("DECRBY", names.queued_counter(model, version), answered)


async def effects(
    link: HotLink, outside: Sequence[Command], inside: Sequence[Command]
) -> list[Any]:
    """Send ``outside`` (other slots: replies, forwards), then ``inside`` in one MULTI.

    One pipeline on one server; on a cluster, the link sends each slot's commands in this
    order. The results of ``inside``; the first error of either raised, as a
    ResponseError (the caller retries the whole: what ran of ``outside`` runs again).
    """
    replies = await link.call(*outside, ("MULTI",), *inside, ("EXEC",))
    raise_errors(replies[:-1])
    results = replies[-1]
    if not isinstance(results, list):
        raise ResponseError(f"transaction did not run: {results!r}")
    return raise_errors(results)


def _flat(fields: Mapping[bytes, Arg]) -> list[Arg]:
    return [item for pair in fields.items() for item in pair]
