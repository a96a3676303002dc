"""A batch that holds the worker's event loop too long: the worker's stall limit.

A lane runs a one-instance model's short batches in the event loop (:mod:`workers.lane`),
since a trip through a thread would cost each of them CPU. While such a batch runs, the loop
does nothing else: no lane reads or writes, and the heartbeat stops. A handler that hangs on
one input (a loop that never ends, a lock never released) would hold the whole worker for
good, and once its heartbeat lapsed, live workers would claim that batch and hang on it in
turn, one after another.

One thread per worker watches the batch that runs in the loop, if any (:class:`StallGuard`).
Once it has run a quarter of the heartbeat's TTL, the thread keeps the worker registered, so
that no peer claims a batch still running. Past the stall limit (``WEIR_WORKER_INLINE_STALL_S``)
it does for the batch what the loop would do for one past a response timeout: it
dead-letters the batch (each request answered with a 500 that names the limit), on a
blocking Redis connection of its own, and ends the worker (:func:`exit_stuck`) for its
supervisor to replace. The batch is acked with its dead letter, so nobody runs it again.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from redis import Redis
from redis.exceptions import RedisError

from weir.liveness import prolong
from weir.redis_io.connection import connect_sync
from weir.service import EXIT_REPLACE
from weir.streams import Entry
from workers.write_back import WriteBack

logger = logging.getLogger(__name__)


EXIT_STUCK = EXIT_REPLACE  # the worker's exit status after a batch or a load ran past a limit
ANSWERED = "its requests were answered with an error"


def exit_stuck(what: str, told: str = ANSWERED) -> NoReturn:
    """End the worker at once: work it can neither stop nor wait for still runs."""
    logger.critical(
        "%s and still runs: %s; this worker exits so that a fresh one takes its place "
        "(live workers claim the batches it held)",
        what,
        told,
    )
    logging.shutdown()
    sys.stderr.flush()
    os._exit(EXIT_STUCK)


@dataclass(frozen=True, slots=True)
class InlineRun:
    """A batch running in the event loop, since ``started_s`` (monotonic)."""

    entry: Entry
    write_back: WriteBack
    started_s: float


class StallGuard:
    """Watches the batch that runs in one worker's event loop (see the module).

    Starting and ending a watch is an attribute set, no lock taken and no thread woken per
    batch; the thread looks every ``tick_s``, a quarter of the TTL or of the limit.
    ``limit_s`` 0: no limit, the worker is kept registered for as long as the batch runs.
    """

    def __init__(
        self, redis_url: str, group: str, consumer: str, ttl_s: float, limit_s: float
    ) -> None:
        self.redis_url = redis_url
        self.group = group
        self.consumer = consumer
        self.ttl_s = ttl_s
        self.limit_s = limit_s
        self.tick_s = min(ttl_s, limit_s or ttl_s) / 4
        self.running: InlineRun | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Redis | None = None

    def begin(self, entry: Entry, write_back: WriteBack) -> None:
        """``entry``'s batch starts running in the event loop."""
        self.running = InlineRun(entry, write_back, time.monotonic())

    def end(self) -> None:
        self.running = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="stall guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._client is not None:
            self._client.close()

    def _watch(self) -> None:
        while not self._stop.wait(self.tick_s):
            run = self.running
            if run is None:
                continue
            lasted_s = time.monotonic() - run.started_s
            if self.limit_s and lasted_s >= self.limit_s and self.running is run:
                self._dead_letter(run)
                exit_stuck(f"a batch of {run.write_back.label} ran {lasted_s:.1f} s in the loop")
            if lasted_s >= self.ttl_s / 4:
                self._keep_registered()

    def _keep_registered(self) -> None:
        try:
            prolong(self._redis(), self.group, self.consumer, self.ttl_s)
        except RedisError as exc:
            logger.warning("could not keep a stalled worker registered: %s", exc)

    def _dead_letter(self, run: InlineRun) -> None:
        reason = (
            f"it ran {self.limit_s:g} s in the worker's event loop without finishing "
            "(the worker's stall limit, WEIR_WORKER_INLINE_STALL_S)"
        )
        try:
            outside, inside = run.write_back.dead_letter_commands(run.entry, reason)
            # Any: redis-py types execute_command in some releases only.
            client: Any = self._redis()
            for command in outside:
                client.execute_command(*command)
            transaction = client.pipeline(transaction=True)
            for command in inside:
                transaction.execute_command(*command)
            transaction.execute()
        except Exception:
            # Unacked, the batch is claimed by a live worker once this one is gone.
            label = run.write_back.label
            logger.exception("batch %s of %s could not be dead-lettered", run.entry.id, label)

    def _redis(self) -> Redis:
        if self._client is None:
            self._client = connect_sync(self.redis_url, socket_timeout=max(self.ttl_s, 1.0))
        return self._client
