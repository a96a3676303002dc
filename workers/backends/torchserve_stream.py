"""TorchServe's streamed answers: ``send_intermediate_predict_response`` served by Weir.

A TorchServe handler streams by calling ``send_intermediate_predict_response(ret,
context.request_ids, message, code, context)`` (from ``ts.handler_utils.utils`` or
``ts.protocol.otf_message_handler``) from inside ``handle``: TorchServe's function encodes
one answer per request of the batch into its backend's frame and writes the frame to
``context.cl_socket``. Weir's context holds a :class:`PartSocket` there, which reads the
frame back and sends each request its part at once (:func:`workers.batch_wait.send_part`):
the gateway streams it to the client (HTTP chunks, TorchServe's ``StreamPredictions``) and
the value ``handle`` finally returns ends the stream. A handler without the ``ts`` package
may write the same frame itself, as TorchServe's examples do.

The frame (TorchServe's ``create_predict_response``): big-endian int32 lengths and codes;
the batch's code and message; then per request its id, content type, status code, reason
phrase, headers and body; an id length of -1 ends it.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

import numpy as np

from weir.errors import ServerError
from weir.torchserve import envelope
from workers.backends.torchserve_context import CONTENT_TYPE, Context
from workers.batch_wait import send_part

logger = logging.getLogger(__name__)

_INT = struct.Struct("!i")


@dataclass(frozen=True, slots=True)
class FramedAnswer:
    """One request's answer in a frame."""

    request_id: str
    status: int
    headers: dict[str, str]
    body: bytes


def read_frame(frame: bytes) -> list[FramedAnswer]:
    """The answers of one predict-response frame; ValueError when it is not one."""
    reader = _Reader(frame)
    reader.number()  # the batch's code: each answer has its own
    reader.text()  # the batch's message
    answers = []
    while (length := reader.number()) != -1:
        request_id = reader.take(length).decode("utf-8")
        content_type = reader.text()
        status = reader.number()
        reader.text()  # the reason phrase: dropped, as for every answer (docs/torchserve.md)
        headers = {reader.text(): reader.text() for _ in range(reader.number())}
        if content_type and not any(k.lower() == CONTENT_TYPE for k in headers):
            headers[CONTENT_TYPE] = content_type
        answers.append(FramedAnswer(request_id, status, headers, reader.take(reader.number())))
    return answers


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.at = 0

    def number(self) -> int:
        if self.at + 4 > len(self.data):
            raise ValueError("the frame ends inside a length")
        (value,) = _INT.unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def take(self, length: int) -> bytes:
        if length < 0 or self.at + length > len(self.data):
            raise ValueError(f"the frame has no {length} bytes at {self.at}")
        value = bytes(self.data[self.at : self.at + length])
        self.at += length
        return value

    def text(self) -> str:
        return self.take(self.number()).decode("utf-8")


class PartSocket:
    """``context.cl_socket``: what a handler streams through it reaches its requests."""

    def __init__(self, model: str, context: Context, batches: bool) -> None:
        self.model = model
        self.context = context
        self.shape = (1, 1) if batches else (1,)

    def sendall(self, frame: bytes | bytearray) -> None:
        try:
            answers = read_frame(bytes(frame))
        except (ValueError, UnicodeDecodeError) as exc:
            message = f"model '{self.model}': an unreadable streamed answer: {exc}"
            raise ServerError(message) from None
        rows = {request_id: row for row, request_id in (self.context.request_ids or {}).items()}
        for answer in answers:
            row = rows.get(answer.request_id)
            if row is None:
                logger.warning("model %s streamed to no request of its batch", self.model)
            elif not send_part(row, self._outputs(answer)):
                logger.warning("model %s streamed outside handle: dropped", self.model)

    def _outputs(self, answer: FramedAnswer) -> dict[str, np.ndarray]:
        response = np.empty(1, dtype=object)
        response[0] = answer.body
        headers = np.empty(1, dtype=object)
        headers[0] = envelope.pack_headers(answer.headers)
        return {
            envelope.RESPONSE: response.reshape(self.shape),
            envelope.STATUS: np.array([answer.status], dtype=np.int32).reshape(self.shape),
            envelope.HEADERS: headers.reshape(self.shape),
        }
