"""Parts of a streamed answer, written to the requester's gateway while their batch runs.

A backend that streams (a TorchServe handler calling ``send_intermediate_predict_response``,
a decoupled Python model calling ``context.send_part``) hands each part to
:func:`workers.batch_wait.send_part`, which gives it to the lane's :class:`PartWriter`.
The part goes out as a reply with a number (``part``, from 0 in each run
of the batch) on the request's reply stream, before the answer that ends it. A batch run in
an executor thread waits until its part is written, so parts keep their order and a handler
that streams faster than Redis takes them is held back. A batch run in the event loop
cannot wait on it: its parts are written just before its answers, and the lane runs its
later batches in threads (:meth:`workers.lane.WorkerLane._inline`).

A batch delivered again (its worker died) or run again in halves (a failure) sends its parts
again from 0; the gateway passes on only those past the last it passed on
(:class:`gateway.parts.PartFilter`). A part that cannot be written (Redis away) is dropped
with a warning: the answer that ends the stream is written as every answer is, with retries.
A pipeline step's parts go nowhere: only the pipeline's answer reaches its requester.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
from redis.exceptions import RedisError

from weir import stages
from weir.config import ModelConfig
from weir.errors import ServerError
from weir.redis_io.link import Command, HotLink, raise_errors
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest

logger = logging.getLogger(__name__)


class PartWriter:
    """Writes the parts the backends of one lane send, on the worker's link."""

    def __init__(self, link: HotLink, config: ModelConfig, maxlen: int, timeout_s: float) -> None:
        self.link = link
        self.config = config
        self.maxlen = maxlen
        self.timeout_s = timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None  # the lane's, bound as it runs
        self.used = False  # a part was sent: the lane's batches then run in threads
        self._pending: list[Command] = []  # parts of a batch run in the loop

    def sink(self, request: InferRequest, number: int, outputs: dict[str, np.ndarray]) -> None:
        """Send ``request`` part ``number`` (a :data:`workers.batch_wait.PartSink`)."""
        self.used = True
        if request.route is not None or self.loop is None:
            return
        reply = InferReply(request.id, request.model, request.version, self._tensors(outputs))
        reply.part = number
        commands = stages.answer([(request.reply_to, reply.encode())], self.maxlen)
        if _running_loop() is self.loop:
            self._pending.extend(commands)
            return
        try:
            future = asyncio.run_coroutine_threadsafe(self._write(commands), self.loop)
        except RuntimeError as exc:  # the loop is closed: the worker is stopping
            logger.warning("part %d of request %s was not written: %s", number, request.id, exc)
            return
        try:
            future.result(self.timeout_s)
        except (RedisError, TimeoutError) as exc:
            future.cancel()
            logger.warning("part %d of request %s was not written: %s", number, request.id, exc)

    async def flush(self) -> None:
        """Write the parts of a batch run in the loop: before its answers, in their order."""
        if not self._pending:
            return
        commands, self._pending = self._pending, []
        try:
            await self._write(commands)
        except RedisError as exc:
            logger.warning("%d parts were not written: %s", len(commands), exc)

    async def _write(self, commands: list[Command]) -> None:
        raise_errors(await self.link.call(*commands))

    def _tensors(self, outputs: dict[str, np.ndarray]) -> dict[str, Tensor]:
        tensors = {}
        for name, array in outputs.items():
            spec = self.config.output_spec(name)
            if spec is None:
                raise ServerError(f"model '{self.config.name}' has no output {name}")
            tensors[name] = Tensor.from_numpy(np.asarray(array), spec.datatype)
        return tensors


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # an executor thread
        return None
