"""TorchServe's ``/predictions`` and ``/explanations`` answered by the HTTP protocol itself.

As KServe's infer (:mod:`gateway.direct_infer`), a plain ``POST`` or ``PUT`` prediction
skips ASGI: no scope, request or response objects, no ``send`` messages, no middleware.
It runs the same :func:`gateway.torchserve.inference_routes.prediction` as the ASGI path,
with the same headers (all of them reach the handler), query parameters, forms, body limit
(``max_request_size``), token, metrics and error shape. What this path does not take (an
escaped character in the target, ``Expect: 100-continue``, a pipelined request, the
management port) goes to the ASGI app, which answers it alike.
"""

from __future__ import annotations

import logging
import re

import orjson
from starlette.datastructures import Headers
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from gateway.direct_infer import InferExchange
from gateway.disconnect import Disconnect
from gateway.state import GatewayState
from gateway.torchserve.inference_routes import Answer, Prediction, prediction
from gateway.torchserve.responses import ERROR_TYPES
from gateway.torchserve.streaming import ChunkedAnswer, error_content
from weir.errors import WeirError

logger = logging.getLogger(__name__)

# The raw request target, as INFER_TARGET: no escapes; the query is the handler's.
PREDICTION_TARGET = re.compile(
    rb"/(predictions|explanations)/([^/?%#]+)(?:/([^/?%#]+))?(?:\?([^#]*))?", re.ASCII
)
_JSON = "application/json"


class PredictionExchange(InferExchange):
    """One TorchServe prediction and its answer, in place of uvicorn's request cycle."""

    __slots__ = ("explain", "query", "raw_headers", "stream")

    def __init__(
        self,
        model: str,
        version: str | None,
        explain: bool,
        query: bytes,
        raw_headers: list[tuple[bytes, bytes]],
        keep_alive: bool,
    ) -> None:
        wanted = {n: v.decode("latin-1") for n, v in raw_headers if n in _BODY_HEADERS}
        super().__init__(model, version, wanted, keep_alive)
        self.explain = explain
        self.query = query
        self.raw_headers = raw_headers
        self.stream: ChunkedAnswer | None = None  # where the handler's parts go, if it streams

    def body_limit(self, state: GatewayState) -> int:
        return state.settings.ts_max_request_size_bytes

    async def run(self, state: GatewayState, disconnect: Disconnect) -> tuple[int, list[bytes]]:
        """The handler's status, and the head's header lines and body it answered.

        No lines when the answer was streamed (:mod:`gateway.torchserve.streaming`): the
        stream has been written, and ended, on the connection.
        """
        stream = self.stream
        try:
            self.check_token(state)
            asked = Prediction(
                self.model, self.version, self.explain, Headers(raw=self.raw_headers), self.query
            )
            on_part = None if stream is None else stream.part
            answer = await prediction(state, asked, self._read, disconnect.follow, on_part)
            if stream is not None and stream.started:
                stream.end(answer.content)
                return stream.status, []
            if answer.status not in STATUS_LINE:
                logger.error("the handler of %s answered status %d", self.model, answer.status)
                return 500, _error(500, "the handler answered an invalid status", "")
            return answer.status, _head(answer)
        except WeirError as exc:
            if stream is not None and stream.started:  # only the body can say it now
                stream.end(error_content(exc))
                return stream.status, []
            error_type = ERROR_TYPES[exc.kind]
            return exc.http_status, _error(exc.http_status, exc.message, error_type, exc.headers)
        except Exception:
            logger.exception("prediction failed")
            if stream is not None and stream.started:
                stream.abort()
                return stream.status, []
            return 500, _error(500, "internal error in the gateway", "InternalServerException")

    async def _read(self) -> bytes:
        return self._body()


_BODY_HEADERS = frozenset((b"authorization", b"content-encoding", b"content-length"))


def _head(answer: Answer) -> list[bytes]:
    """The handler's headers, and a content-length unless it gave one, then the body."""
    lines = []
    has_length = False
    for name, value in answer.headers.items():
        lowered = name.lower()
        has_length = has_length or lowered == "content-length"
        lines.append(b"%s: %s\r\n" % (lowered.encode("latin-1"), value.encode("latin-1")))
    if not has_length:
        lines.append(b"content-length: %d\r\n" % len(answer.content))
    lines.append(answer.content)
    return lines


def _error(
    status: int, message: str, error_type: str, headers: dict[str, str] | None = None
) -> list[bytes]:
    """TorchServe's ``ErrorResponse``, as :func:`gateway.torchserve.responses.error_response`."""
    body = {"code": status, "type": error_type or "InternalServerException", "message": message}
    content = orjson.dumps(body, option=orjson.OPT_INDENT_2)
    return _head(Answer(status, {"content-type": _JSON, **(headers or {})}, content))


def prediction_exchange(
    method: bytes, url: bytes, raw_headers: list[tuple[bytes, bytes]], keep_alive: bool
) -> PredictionExchange | None:
    """An exchange for a prediction the protocol can answer itself, else None."""
    if method not in (b"POST", b"PUT") or not url.isascii():
        return None
    match = PREDICTION_TARGET.fullmatch(url)
    if match is None:
        return None
    kind, model, version, query = match.groups()
    return PredictionExchange(
        model.decode("ascii"),
        None if version is None else version.decode("ascii"),
        kind == b"explanations",
        query or b"",
        raw_headers,
        keep_alive,
    )
