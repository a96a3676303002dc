"""Dead letters: batches that were delivered too often, parked for inspection and replay.

``weir dead-letters list`` shows them; ``weir dead-letters replay`` puts them back on their
model's batch stream (and counts their requests as queued again) and removes them from the
dead-letter stream, in one transaction per batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis

from weir import names, wire
from weir.redis_io.connection import connect

_DEAD = re.compile(r"^weir:\{(?P<model>[^}]+)\}:(?P<version>[^:]+):dead$")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One parked batch."""

    model: str
    version: str
    id: str
    reason: str
    requests: int
    payload: bytes


async def dead_letter_streams(redis: Redis) -> list[tuple[str, str]]:
    """Every (model, version) that has a dead-letter stream."""
    found = set()
    async for key in redis.scan_iter(match=names.dead_letter_stream("*", "*"), count=200):
        match = _DEAD.match(key.decode() if isinstance(key, bytes) else key)
        if match:
            found.add((match["model"], match["version"]))
    return sorted(found)


async def list_dead_letters(redis: Redis, model: str | None = None) -> list[DeadLetter]:
    letters = []
    for found_model, version in await dead_letter_streams(redis):
        if model is not None and found_model != model:
            continue
        stream = names.dead_letter_stream(found_model, version)
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(stream))
        for entry_id, fields in entries:
            payload = fields.get(wire.PAYLOAD, b"")
            letters.append(
                DeadLetter(
                    found_model,
                    version,
                    entry_id.decode(),
                    fields.get(b"reason", b"").decode(),
                    _count(payload),
                    payload,
                )
            )
    return letters


def _count(payload: bytes) -> int:
    try:
        return len(wire.decode_batch(payload))
    except ValueError:
        return 0


async def replay(redis: Redis, letter: DeadLetter) -> None:
    """Put one dead letter back on its batch stream and remove it from the dead letters."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.xadd(names.batch_stream(letter.model, letter.version), {wire.PAYLOAD: letter.payload})
        pipe.incrby(names.queued_counter(letter.model, letter.version), letter.requests)
        pipe.xdel(names.dead_letter_stream(letter.model, letter.version), letter.id)
        await pipe.execute()


async def run(redis_url: str, action: str, model: str | None, letter_id: str | None) -> int:
    redis = connect(redis_url)
    try:
        letters = await list_dead_letters(redis, model)
        if letter_id is not None:
            letters = [letter for letter in letters if letter.id == letter_id]
        for letter in letters:
            if action == "replay":
                await replay(redis, letter)
            verb = "replayed" if action == "replay" else "dead"
            print(
                f"{verb} {letter.model}:{letter.version} {letter.id} "
                f"requests={letter.requests} reason={letter.reason}"
            )
        if not letters:
            print("no dead letters")
        return 0
    finally:
        await redis.aclose()
