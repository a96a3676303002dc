"""The parts of a streamed answer, as the gateway hands them on.

A worker whose backend streams sends a request numbered parts before its answer
(:mod:`workers.parts`); the answer, a reply with no number, ends the stream. A request that
can take parts registers a listener with :meth:`gateway.mesh.MeshClient.infer`; a request
that cannot (KServe's infer) gets only the answer, and its parts are dropped.

Parts come in order. A batch run again (its worker died, or it failed and was run again in
halves) sends its parts again from 0: :class:`PartFilter` passes on only the parts past the
last it passed on, so a handler that streams the same parts again continues the stream where
it was. :func:`parts_then_answer` turns the parts and the answer into one async iterator, for
a consumer that awaits each (an ASGI response, a gRPC stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

from weir.errors import Unsupported
from weir.repository import ModelEntry
from weir.wire import InferReply

PartListener = Callable[[InferReply], None]
T = TypeVar("T")
HTTP_DECOUPLED = "HTTP end point doesn't support models with decoupled transaction policy"


def refuse_decoupled(entry: ModelEntry, message: str) -> None:
    """Triton's UNSUPPORTED for a decoupled model on an endpoint of one response a request."""
    if entry.config.decoupled:
        raise Unsupported(message)


class PartFilter:
    """Passes each part on once, in order, whatever runs of the batch sent it."""

    __slots__ = ("listener", "passed")

    def __init__(self, listener: PartListener) -> None:
        self.listener = listener
        self.passed = 0  # the parts passed on: the next one is numbered so

    def take(self, reply: InferReply) -> None:
        number = reply.part
        if not isinstance(number, int) or number < self.passed:
            return  # a part passed on already (a run again), or no number at all
        self.passed = number + 1
        self.listener(reply)


class Streamed(Generic[T]):
    """One item of :func:`parts_then_answer`: a part, or the answer (``last``)."""

    __slots__ = ("last", "value")

    def __init__(self, value: T, last: bool) -> None:
        self.value = value
        self.last = last


async def parts_then_answer(
    run: Callable[[Callable[[T], None]], Awaitable[T]],
) -> AsyncIterator[Streamed[T]]:
    """Each part as it comes, then the answer; what ``run`` raises is raised after its parts.

    ``run`` gets the callable that takes a part, and returns the answer. It runs as a task,
    cancelled when the iteration stops early.
    """
    parts: asyncio.Queue[T] = asyncio.Queue()
    task = asyncio.ensure_future(run(parts.put_nowait))
    try:
        while not task.done():
            getter = asyncio.ensure_future(parts.get())
            await asyncio.wait((task, getter), return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield Streamed(getter.result(), last=False)
            else:
                getter.cancel()
        while not parts.empty():
            yield Streamed(parts.get_nowait(), last=False)
        yield Streamed(task.result(), last=True)
    finally:
        task.cancel()
