"""A decoupled Triton Python model's response senders.

Each request of a decoupled model's batch has a :class:`ResponseSender`
(``request.get_response_sender()``). ``send(response)`` sends its outputs to the request's
client at once, as a part of its answer (:mod:`workers.parts`), from ``execute`` or from any
thread of the model's after ``execute`` returns; ``send(response, flags=...FINAL)`` (with
or without a last response) ends the request. The instance waits in :func:`finish`
until every request of the batch is ended, or until nobody waits for the batch any more
(every request past its deadline or its client gone). The request's answer then carries no
outputs: it only ends the stream (a gRPC client that asked for
``triton_enable_empty_final_response`` gets it as Triton's empty final response).

A response with an error fails its request with the error's message and the meaning of its
code; the batch is then run again in halves, as any failed batch (:mod:`workers.execution`),
and the parts sent again are passed on only past those already passed on.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from weir.config import ModelConfig
from weir.errors import (
    DeadlineExceeded,
    InvalidInput,
    NotFound,
    ServerError,
    Unavailable,
    Unsupported,
    WeirError,
)
from weir.wire import InferRequest
from workers import batch_wait
from workers.backends import pb_utils
from workers.batch_wait import BatchWait

ERRORS: Mapping[int, type[WeirError]] = {
    pb_utils.TritonError.INVALID_ARG: InvalidInput,
    pb_utils.TritonError.NOT_FOUND: NotFound,
    pb_utils.TritonError.UNAVAILABLE: Unavailable,
    pb_utils.TritonError.UNSUPPORTED: Unsupported,
}
WAIT_STEP_S = 0.05  # how often a waiting instance checks whether anyone still waits


def error_of(response: Any) -> WeirError | None:
    """The response's error with its code's meaning, if it carries one."""
    error = response.error() if response.has_error() else None
    if error is None:
        return None
    return ERRORS.get(error.code(), ServerError)(str(error.message()))


class ResponseSender:
    """Sends one request of a decoupled model's batch its responses."""

    def __init__(
        self, config: ModelConfig, wait: BatchWait | None, member: InferRequest | None, rows: int
    ) -> None:
        self.config = config
        self.wait = wait
        self.member = member
        self.rows = rows
        self.done = threading.Event()
        self.error: WeirError | None = None
        self._sent = 0
        self._lock = threading.Lock()  # the model may send from threads of its own

    def send(self, response: Any = None, flags: int = 0) -> None:
        with self._lock:
            if self.done.is_set():
                raise pb_utils.TritonModelException("the request was already sent its final flag")
            if response is not None:
                self._send(response)
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.done.set()

    def is_cancelled(self) -> bool:
        member, wait = self.member, self.wait
        return member is not None and wait is not None and wait.is_canceled(member.id)

    def _send(self, response: Any) -> None:
        error = error_of(response)
        if error is not None:
            self.error = self.error or error
            return
        sink = None if self.wait is None else self.wait.sink
        if sink is None or self.member is None:
            return  # nowhere to go: outside a served batch (a warm-up sample)
        outputs = {}
        for tensor in response.output_tensors():
            outputs[tensor.name()] = self._array(tensor.name(), tensor.as_numpy())
        sink(self.member, self._sent, outputs)
        self._sent += 1

    def _array(self, name: str, value: np.ndarray) -> np.ndarray:
        from workers.backends.python_backend import output_array

        model = self.config.name
        spec = self.config.output_spec(name)
        if spec is None:
            raise pb_utils.TritonModelException(f"model '{model}' has no output {name}")
        array = output_array(model, name, spec.datatype, value)
        if self.config.max_batch_size > 0 and (array.ndim == 0 or array.shape[0] != self.rows):
            raise pb_utils.TritonModelException(
                f"model '{model}' sent {name} with shape {list(array.shape)} for a request of "
                f"{self.rows} rows: its first dimension is the request's rows"
            )
        return array


def finish(model: str, senders: list[ResponseSender]) -> dict[str, np.ndarray]:
    """Wait until each request is ended; no outputs (each was sent), or the first error."""
    for sender in senders:
        while not sender.done.wait(WAIT_STEP_S):
            if batch_wait.is_cancelled():
                raise DeadlineExceeded(
                    f"{DeadlineExceeded.TRITON_TEXT}: model '{model}' did not send every "
                    "request its final flag while anyone waited"
                )
    errors = [s.error for s in senders if s.error is not None]
    if errors:
        raise errors[0]
    return {}
