"""Re-submitting what the gateway accepted when Redis turns out to be another server.

Redis replication is asynchronous: when a replica takes over from a failed primary (Redis
Sentinel, or a cluster's failover), the writes the old primary acknowledged last may never
have reached it, and a Redis that restarts without persistence keeps nothing at all. The
requests those writes queued, and the replies to them, are then gone, while the clients
still wait. The gateway holds every request it is waiting on, so it can put them back.

Its reply reader records the ``run_id`` of the server its connection reaches (each Redis
process has its own); on a Redis Cluster, where a connection reaches many, it counts the
slots whose primary changed in the slot map it fetches again every second. When a
reconnect reaches a different server, or a slot another primary, the gateway re-submits
every request it accepted and has not answered, with the same request id and deadline, past
the queue limits (they were admitted once). Some of them may have survived and run twice:
the gateway answers each request once, with the first reply, and drops the other, as it
does for a redelivered batch. A re-submission that Redis refuses is retried with a backoff
until it is queued or the request is answered or past its deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from gateway.codec import InferBody
from weir import wire
from weir.errors import Unavailable, WeirError
from weir.redis_io.retry import RetryWait
from weir.repository import ModelEntry
from weir.wire import InferRequest

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Accepted:
    """What it takes to queue an accepted request again."""

    entry: ModelEntry
    version: str
    request: InferRequest
    body: InferBody
    batch: int
    level: int


class Resubmitter:
    """The accepted requests of one gateway, put back after Redis lost them.

    ``send`` queues one again (past the queue limits); ``fail`` answers a request that can
    no longer be queued (its version was unloaded meanwhile) with the error given.
    """

    def __init__(
        self,
        send: Callable[[Accepted], Awaitable[None]],
        fail: Callable[[str, WeirError], None],
    ) -> None:
        self.send = send
        self.fail = fail
        self.accepted: dict[str, Accepted] = {}
        self.servers: tuple[bytes | None, int] | None = None
        self.resubmitted = 0  # requests re-submitted in the gateway's life
        self._tasks: set[asyncio.Task[None]] = set()

    def server_changed(self, servers: tuple[bytes | None, int]) -> bool:
        """True when ``servers`` are not the ones last recorded (:meth:`record`).

        ``servers``: the run_id the reply connection reached (None when not known) and the
        cluster's count of slots that changed primary. The first ones seen are recorded.
        """
        last = self.servers
        if last is None:
            self.servers = servers
            return False
        (last_id, last_epoch), (server_id, epoch) = last, servers
        return epoch != last_epoch or (None not in (last_id, server_id) and server_id != last_id)

    def record(self, servers: tuple[bytes | None, int]) -> None:
        """The gateway has acted on ``servers`` (its stream made, its requests queued again).

        Recorded only then: a step that fails on the way (the new server not reachable yet
        by every connection) leaves the change to be seen, and acted on, at the next read.
        """
        self.servers = servers

    def resubmit_all(self) -> None:
        """Queue every accepted request again, in the background."""
        accepted = list(self.accepted.values())
        if not accepted:
            return
        logger.warning(
            "Redis is another server now (a failover, or a restart that lost its data): "
            "re-submitting the %d requests this gateway accepted and has not answered",
            len(accepted),
        )
        self.resubmitted += len(accepted)
        for item in accepted:
            task = asyncio.create_task(self._resubmit(item), name="resubmit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _resubmit(self, item: Accepted) -> None:
        request_id = item.request.id
        retry = RetryWait()
        while request_id in self.accepted and wire.now_ns() // 1_000_000 < item.request.deadline_ms:
            try:
                await self.send(item)
                return
            except RedisError as exc:
                logger.warning("re-submitting request %s failed, retrying: %s", request_id, exc)
            except Unavailable as exc:  # refused for now (Redis down, a full queue): again
                logger.warning("re-submitting request %s refused, retrying: %s", request_id, exc)
            except WeirError as exc:  # it can no longer run (its version was unloaded)
                self.fail(request_id, exc)
                return
            await retry.failed()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
