"""The response timeout of a batch that runs in the event loop.

A lane runs short batches in the event loop rather than an executor thread (the trip through
a thread costs each batch a hand-over each way). While such a batch runs, the loop can watch
nothing, so a timer thread watches it: past the model's response timeout it does what the
loop would have done for a batch run in a thread. It dead-letters the batch (each request
answered with a 500), on a blocking Redis connection of its own since the loop is busy, and
ends the worker (:func:`exit_stuck`) for its supervisor to replace, as TorchServe restarts a
backend worker that stopped answering.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

from weir.redis_io.connection import connect_sync
from weir.streams import Entry
from workers.write_back import WriteBack

logger = logging.getLogger(__name__)

EXIT_STUCK = 3  # the worker's exit status after a batch ran past its response timeout


def exit_stuck(what: str) -> NoReturn:
    """End the worker at once: an instance's thread still runs a batch nobody waits for."""
    logger.critical(
        "%s and still runs: its requests were answered with an error; this worker exits so "
        "that a fresh one takes its place (live workers claim the batches it held)",
        what,
    )
    logging.shutdown()
    sys.stderr.flush()
    os._exit(EXIT_STUCK)


def timeout_reason(timeout_s: float) -> str:
    """Why a batch past ``timeout_s`` was dead-lettered, as its requests' 500s say."""
    return f"it ran past the model's response timeout ({timeout_s:g} s)"


class InlineWatchdog:
    """Ends the worker when a batch run in the event loop passes the response timeout.

    One thread per lane, started with its first watched batch, watches whichever batch runs
    now: starting and ending a watch is a lock taken twice, no thread made or woken per
    batch. Idle, the thread looks once per timeout; watching, it wakes at the deadline.
    """

    def __init__(self, redis_url: str, write_back: WriteBack, label: str, timeout_s: float):
        self.redis_url = redis_url
        self.write_back = write_back
        self.label = label
        self.timeout_s = timeout_s
        self._lock = threading.Condition()
        self._watched: tuple[Entry, float] | None = None  # the batch, and its deadline
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, entry: Entry) -> Iterator[None]:
        """While ``entry``'s batch runs in the loop."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name=f"watchdog {self.label}", daemon=True
                )
                self._thread.start()
            self._watched = (entry, time.monotonic() + self.timeout_s)
        try:
            yield
        finally:
            with self._lock:
                self._watched = None

    def _watch(self) -> None:
        with self._lock:
            while True:
                if self._watched is None:
                    self._lock.wait(self.timeout_s)
                    continue
                entry, deadline = self._watched
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
        self._expired(entry)

    def _expired(self, entry: Entry) -> None:
        reason = timeout_reason(self.timeout_s)
        try:
            outside, inside = self.write_back.dead_letter_commands(entry, reason)
            client = connect_sync(self.redis_url, socket_timeout=5.0)
            for command in outside:
                client.execute_command(*command)  # type: ignore[no-untyped-call]
            transaction = client.pipeline(transaction=True)
            for command in inside:
                transaction.execute_command(*command)  # type: ignore[no-untyped-call]
            transaction.execute()
        except Exception:
            # Unacked, the batch is claimed by a live worker once this one is gone.
            logger.exception("batch %s of %s could not be dead-lettered", entry.id, self.label)
        exit_stuck(f"a batch of {self.label} ran past its response timeout ({self.timeout_s:g} s)")
