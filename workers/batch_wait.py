"""Whether anyone still waits for the batch a backend is running, and for how long.

A worker runs a batch in an executor thread; while it does, :func:`running` makes the
batch's requests known to that thread, so a handler that loops over a long input can ask
(through its context, see :mod:`workers.backends.python_backend`) and stop early, as
Triton's Python backend offers with ``request.is_cancelled()``:

- :func:`time_left_s`: seconds until the last deadline among the batch's requests;
- :func:`is_cancelled`: True once no request of the batch is waited for (each is past its
  deadline, or its client left), so whatever the handler computes would be thrown away.

Outside a batch (``initialize``, warmup) nothing is cancelled and the time left is endless.

The same knowledge lets a backend stream: :func:`send_part` sends the request that holds a
row of the batch a part of its answer at once, while the batch runs (TorchServe's
``send_intermediate_predict_response``), through the sink the worker gave the batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

from weir.wire import InferRequest

# Sends a request a part of its answer: the request, the part's number (from 0 in this
# run) and the part's outputs, shaped as the request's rows.
PartSink = Callable[[InferRequest, int, dict[str, np.ndarray]], None]


@dataclass(slots=True)
class BatchWait:
    """The requests of the batch a thread is running, and the cancel check to ask."""

    requests: Sequence[InferRequest]
    is_canceled: Callable[[str], bool]
    sink: PartSink | None = None  # where parts go; None: the batch cannot stream
    rows: Sequence[int] = ()  # each request's rows of the batch (one each when empty)
    parts: dict[str, int] = field(default_factory=dict)  # parts sent, by request id

    def time_left_s(self) -> float:
        deadlines = [r.deadline_ms for r in self.requests]
        if not deadlines or not all(deadlines):
            return math.inf  # a request with no deadline waits forever
        return max(deadlines) / 1000 - time.time()

    def is_cancelled(self) -> bool:
        now_ms = time.time() * 1000
        # The first request still waited for ends the search: usually the first one.
        return not any(
            (not r.deadline_ms or r.deadline_ms > now_ms) and not self.is_canceled(r.id)
            for r in self.requests
        )


_CURRENT: ContextVar[BatchWait | None] = ContextVar("weir_batch_wait", default=None)


@contextmanager
def running(
    requests: list[InferRequest],
    is_canceled: Callable[[str], bool],
    sink: PartSink | None = None,
    rows: Sequence[int] = (),
) -> Iterator[None]:
    """Make ``requests`` the batch this thread runs, for the duration of the block."""
    token = _CURRENT.set(BatchWait(requests, is_canceled, sink, rows))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> BatchWait | None:
    """The batch this thread runs, if it runs one."""
    return _CURRENT.get()


def time_left_s() -> float:
    """Seconds until the running batch's last deadline (inf outside a batch)."""
    wait = _CURRENT.get()
    return math.inf if wait is None else wait.time_left_s()


def is_cancelled() -> bool:
    """Whether nobody waits for the running batch any more (False outside a batch)."""
    wait = _CURRENT.get()
    return wait is not None and wait.is_cancelled()


def send_part(row: int, outputs: dict[str, np.ndarray]) -> bool:
    """Send the request holding ``row`` of the running batch a part of its answer now.

    ``outputs``: the part's outputs, shaped as that request's rows. False when nothing can
    take it: no batch runs in this thread, or its worker streams nothing.
    """
    wait = _CURRENT.get()
    if wait is None or wait.sink is None:
        return False
    request = _holder(wait, row)
    number = wait.parts.get(request.id, 0)
    wait.parts[request.id] = number + 1
    wait.sink(request, number, outputs)
    return True


def _holder(wait: BatchWait, row: int) -> InferRequest:
    if not wait.rows:
        return wait.requests[row]
    end = 0
    for request, rows in zip(wait.requests, wait.rows, strict=True):
        end += rows
        if row < end:
            return request
    raise IndexError(f"row {row} is past the batch's {end} rows")


def sort_requests(
    requests: list[InferRequest], now_ms: float, is_canceled: Callable[[str], bool]
) -> tuple[list[InferRequest], list[InferRequest], list[InferRequest]]:
    """A batch's requests to run, those past their deadline, and those nobody waits for.

    The cancelled are dropped without a reply (their client left); the expired answered
    with Triton's timeout error.
    """
    live: list[InferRequest] = []
    expired: list[InferRequest] = []
    canceled: list[InferRequest] = []
    for request in requests:
        if request.deadline_ms <= now_ms:
            expired.append(request)
        elif is_canceled(request.id):
            canceled.append(request)
        else:
            live.append(request)
    return live, expired, canceled


def never(_: str) -> bool:
    return False
