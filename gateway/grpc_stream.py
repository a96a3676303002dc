"""``ModelStreamInfer``: a stream's requests, each answered as soon as it is done.

Up to :data:`STREAM_IN_FLIGHT` requests of one stream run at once; past that the stream is
read no further until one is answered. Requests of one sequence (``sequence_id``) run in the
stream's order, each after the one before it is answered: a sequence model takes them in
the order they are queued, and a stream's order is the one its client meant. A decoupled
model's responses before its last are written as they come, each before the request's last
(gateway.grpc_parts).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import service_pb2

from gateway import grpc_wire
from weir.errors import WeirError

if TYPE_CHECKING:
    from gateway.grpc_service import InferenceServicer

logger = logging.getLogger(__name__)

INTERNAL_MESSAGE = "internal error in the gateway"
# Requests of one stream being answered at once; past it the stream is read no further.
STREAM_IN_FLIGHT = 256


class StreamAnswers:
    """A stream's requests, run at once and each answered as soon as it is done.

    Answers may leave out of order; each carries its request's id. A request that fails
    is answered with its message in ``error_message``, and the stream goes on.
    """

    def __init__(self, servicer: InferenceServicer, context: Any) -> None:
        self.servicer = servicer
        self.context = context
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
        self.writing = asyncio.Lock()
        # Each request's turn is taken in the stream's order, once the one before took its.
        self.turn_taken: asyncio.Future[None] | None = None
        self.sequences: dict[object, asyncio.Future[None]] = {}  # each one's last request

    async def submit(self, request: Any) -> None:
        await self.slots.acquire()
        before, self.turn_taken = self.turn_taken, asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._answer(request, Turn(before, self.turn_taken)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def finish(self) -> None:
        """Wait until every request read so far is answered."""
        while self.tasks:
            await asyncio.gather(*self.tasks)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def _answer(self, request: Any, turn: Turn) -> None:
        try:
            parts: list[asyncio.Task[None]] = []  # a decoupled model's responses before it
            response = await self._response(request, parts, turn)
            await asyncio.gather(*parts)
            if response is not None:
                await self._write(response)
        finally:
            self.slots.release()

    async def _write(self, response: Any) -> None:
        async with self.writing:  # in the order the writes were asked for
            await self.context.write(response)

    async def _response(self, wire: bytes, parts: list[asyncio.Task[None]], turn: Turn) -> Any:
        def send(part: Any) -> None:
            response = service_pb2.ModelStreamInferResponse(infer_response=part)
            parts.append(asyncio.ensure_future(self._write(response)))

        try:
            request = await self._in_turn(wire, turn)
            answer = await self.servicer.infer(request, self.context.time_remaining(), send)
            if answer is None:  # a decoupled model's request ended with nothing more to send
                return None
            return service_pb2.ModelStreamInferResponse(infer_response=answer)
        except WeirError as exc:
            message = exc.message
        except Exception:
            logger.exception("gRPC stream inference failed")
            message = INTERNAL_MESSAGE
        finally:
            self._done(turn)
        name, version, request_id = grpc_wire.head(wire)  # the message may not be decoded
        return service_pb2.ModelStreamInferResponse(
            error_message=message,
            infer_response=service_pb2.ModelInferResponse(
                model_name=name, model_version=version, id=request_id
            ),
        )

    async def _in_turn(self, wire: bytes, turn: Turn) -> Any:
        """The decoded request, once the request of its sequence before it is answered."""
        try:
            request = await self.servicer.decode(wire)
        finally:
            if turn.before is not None:
                await turn.before
            turn.taken.set_result(None)
        key = _sequence_id(request)
        if key is not None:
            turn.sequence, turn.answered = key, asyncio.get_running_loop().create_future()
            previous, self.sequences[key] = self.sequences.get(key), turn.answered
            if previous is not None:
                await asyncio.shield(previous)
        return request

    def _done(self, turn: Turn) -> None:
        if not turn.taken.done():  # cancelled before its turn: the next ones go on
            turn.taken.set_result(None)
        if turn.answered is not None:
            turn.answered.set_result(None)
            if self.sequences.get(turn.sequence) is turn.answered:
                del self.sequences[turn.sequence]


@dataclass
class Turn:
    """A stream request's place: after ``before`` took its turn, and its sequence's."""

    before: asyncio.Future[None] | None
    taken: asyncio.Future[None]
    sequence: object = None
    answered: asyncio.Future[None] | None = None


def _sequence_id(request: Any) -> object:
    """A request's ``sequence_id`` parameter, if it has a non-zero one."""
    if "sequence_id" not in request.parameters:
        return None
    parameter = request.parameters["sequence_id"]
    choice = parameter.WhichOneof("parameter_choice")
    value = getattr(parameter, choice) if choice else None
    return value or None
