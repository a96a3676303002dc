"""A TorchServe handler's streamed answer, sent to the client as it comes.

A handler that calls ``send_intermediate_predict_response`` sends each request parts of its
answer before ``handle`` returns (:mod:`workers.backends.torchserve_stream`). As TorchServe's
frontend does, the first part's status and headers answer the HTTP request, with
``Transfer-Encoding: chunked``; each part's bytes are a chunk, and the answer ``handle``
returns is the last one. (An HTTP/1.0 client gets the bytes unframed, and the connection
closes after them.) A failure after the first part can only be said in the body: TorchServe's
error JSON is the last chunk. An answer with no part before it is sent whole, as ever.

The HTTP protocol's own path writes the stream straight to its transport
(:class:`ChunkedAnswer`); the ASGI path and gRPC's ``StreamPredictions`` await each part
(:func:`gateway.parts.parts_then_answer`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response, StreamingResponse
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gateway.parts import Streamed, parts_then_answer
from gateway.torchserve.responses import ERROR_TYPES
from weir.errors import WeirError

if TYPE_CHECKING:
    from gateway.torchserve.inference_routes import Answer

# Headers of the first part that describe a whole body, not a stream.
_WHOLE_BODY = frozenset(("content-length", "transfer-encoding"))
_END = b"0\r\n\r\n"


def error_content(exc: WeirError) -> bytes:
    """TorchServe's error JSON for ``exc``."""
    body = {"code": exc.http_status, "type": ERROR_TYPES[exc.kind], "message": exc.message}
    return orjson.dumps(body, option=orjson.OPT_INDENT_2)


def stream_headers(headers: dict[str, str]) -> dict[str, str]:
    """The first part's headers, less those of a whole body."""
    return {k: v for k, v in headers.items() if k.lower() not in _WHOLE_BODY}


class ChunkedAnswer:
    """A streamed answer written to the connection's transport as each part comes."""

    __slots__ = ("chunked", "keep_alive", "server_state", "started", "status", "transport")

    def __init__(self, transport: Any, server_state: Any, keep_alive: bool, chunked: bool) -> None:
        self.transport = transport
        self.server_state = server_state  # uvicorn's: its default headers
        self.keep_alive = keep_alive and chunked  # an unframed body ends with the connection
        self.chunked = chunked
        self.started = False
        self.status = 0

    def part(self, answer: Answer) -> None:
        """Send one part: the first with the head."""
        if self.transport.is_closing():
            return
        lines = []
        if not self.started:
            self.started = True
            self.status = answer.status if answer.status in STATUS_LINE else 500
            lines = [STATUS_LINE[self.status]]
            lines.extend(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers)
            for name, value in stream_headers(answer.headers).items():
                pair = (name.lower().encode("latin-1"), value.encode("latin-1"))
                lines.append(b"%s: %s\r\n" % pair)
            if self.chunked:
                lines.append(b"transfer-encoding: chunked\r\n")
            if not self.keep_alive:
                lines.append(b"connection: close\r\n")
            lines.append(b"\r\n")
        lines.append(self._frame(answer.content))
        self.transport.write(b"".join(lines))

    def end(self, content: bytes) -> None:
        """Send the last bytes and end the stream (closing the connection unless kept)."""
        if self.transport.is_closing():
            return
        last = self._frame(content) if content else b""
        self.transport.write(last + _END if self.chunked else last)
        if not self.keep_alive:
            self.transport.close()

    def abort(self) -> None:
        """End a stream that failed unexpectedly: the connection closes unended."""
        self.transport.close()

    def _frame(self, content: bytes) -> bytes:
        if not self.chunked or not content:  # an empty chunk would end the stream
            return content
        return b"%x\r\n%s\r\n" % (len(content), content)


async def asgi_answer(run: Callable[[Callable[[Answer], None]], Awaitable[Answer]]) -> Response:
    """The ASGI response: the answer whole, or streamed from its first part on."""
    stream = parts_then_answer(run)
    first = await anext(stream)  # what fails before any part is raised here
    answer = first.value
    if first.last:
        return Response(answer.content, status_code=answer.status, headers=answer.headers)
    return StreamingResponse(
        _contents(first, stream),
        status_code=answer.status,
        headers=stream_headers(answer.headers),
    )


async def _contents(
    first: Streamed[Answer], rest: AsyncIterator[Streamed[Answer]]
) -> AsyncIterator[bytes]:
    yield first.value.content
    try:
        async for item in rest:
            if item.value.content:
                yield item.value.content
    except WeirError as exc:
        yield error_content(exc)
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
