"""``POST .../infer`` answered by the HTTP protocol itself, with no ASGI in between.

Inference is the gateway's one hot route. Served through ASGI it pays for a scope, a
request and a response object, two ``send`` messages and their header checks, and the
middleware around the app, a fifth of the gateway's CPU per request on a small model. The
gateway's HTTP protocol (:mod:`gateway.http_protocol`) therefore answers a plain infer
request itself: it reads the few headers inference needs in one pass, collects the body as
it arrives, runs the same :func:`gateway.inference.infer_body` as every other way in, and
writes the response's head and body in one write.

Everything else, and every infer request this path does not take (an encoded character in
the path, ``Expect: 100-continue``, a request pipelined behind one still being answered,
the TorchServe management port), goes to the ASGI app as before, whose
:mod:`gateway.fastpath` answers inference with the same result.
"""

from __future__ import annotations

import logging
import re

import orjson

from gateway import compression
from gateway.auth import Scope, check_authorization, required_token
from gateway.compression import BoundedDecoder, Coding
from gateway.disconnect import Disconnect
from gateway.inference import HEADER_LENGTH, encode_response, infer_body, too_large
from gateway.state import GatewayState
from weir.errors import WeirError

logger = logging.getLogger(__name__)

# The raw request target: no escapes (uvicorn's path decodes them; the ASGI path guards
# against an encoded '/'), a query is ignored as on the ASGI path.
INFER_TARGET = re.compile(
    rb"/v2/models/([^/?%#]+)(?:/versions/([^/?%#]+))?/infer(?:\?[^#]*)?", re.ASCII
)
HEADER_LENGTH_KEY = HEADER_LENGTH.encode()
# The request headers inference reads, as the protocol lowercases their names.
_WANTED = frozenset(
    (b"authorization", b"content-encoding", b"content-length", HEADER_LENGTH_KEY,
     b"accept-encoding")
)  # fmt: skip


class InferExchange:
    """One infer request and its response, in place of uvicorn's request-response cycle.

    Carries what uvicorn's protocol reads of a cycle (``response_complete``,
    ``keep_alive``, ``disconnected``); :meth:`feed` takes the body as it arrives and
    :meth:`run` answers once it is complete.
    """

    __slots__ = (
        "_chunks", "_decoder", "_error", "_limit", "_received", "answering", "disconnected",
        "headers", "keep_alive", "model", "response_complete", "version",
    )  # fmt: skip

    def __init__(
        self, model: str, version: str | None, headers: dict[bytes, str], keep_alive: bool
    ) -> None:
        self.model = model
        self.version = version
        self.headers = headers
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False
        self.answering = False  # its answer has been started
        self._chunks: list[bytes] = []
        self._received = 0
        self._decoder: BoundedDecoder | None = None
        self._error: WeirError | None = None
        self._limit = 0

    def body_limit(self, state: GatewayState) -> int:
        """The largest body this request may have."""
        return state.settings.body_limit_bytes

    def start(self, limit_bytes: int) -> bool:
        """Check what the head says of the body before any of it is read; False: refused."""
        self._limit = limit_bytes
        try:
            coding = compression.request_coding(self.headers.get(b"content-encoding"))
            if coding != Coding.IDENTITY:
                self._decoder = BoundedDecoder(coding, limit_bytes)
            declared = self.headers.get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
                raise too_large(int(declared), limit_bytes)
        except WeirError as exc:
            self._error = exc
            return False
        return True

    def feed(self, chunk: bytes, state: GatewayState) -> bool:
        """A piece of the body; False once refused (past the limit, or not decodable).

        After that the rest of the body is only discarded.
        """
        if self._error is not None:
            return False
        limit_bytes = self._limit
        self._received += len(chunk)
        try:
            if self._received > limit_bytes:
                raise too_large(self._received, limit_bytes)
            if self._decoder is None:
                self._chunks.append(chunk)
            else:
                self._chunks.extend(self._decoder.feed(chunk))
        except WeirError as exc:
            self._error = exc
            self._chunks = []
            return False
        return True

    def _body(self) -> bytes:
        if self._error is not None:
            raise self._error
        if self._decoder is not None:
            self._decoder.finish()
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def check_token(self, state: GatewayState) -> None:
        """Unauthorized unless the request carries the inference token (when one is set)."""
        token = required_token(state.settings, Scope.INFERENCE)
        if token is not None:
            authorization = self.headers.get(b"authorization", "")
            check_authorization(authorization, token, Scope.INFERENCE)

    async def run(self, state: GatewayState, disconnect: Disconnect) -> tuple[int, list[bytes]]:
        """The response's status and its head's header lines and body (KServe's shape)."""
        try:
            self.check_token(state)
            entry, version = state.repository.resolve(self.model, self.version)
            try:
                raw = self._body()
            except WeirError as exc:
                state.metrics.failed(entry.name, version, exc.kind)
                raise
            headers = self.headers
            content, header_length = await infer_body(
                state, entry, version, raw, headers.get(HEADER_LENGTH_KEY), disconnect
            )
            content, extra, media_type = await encode_response(
                content, header_length, headers.get(b"accept-encoding")
            )
            return 200, _head(media_type, content, extra)
        except WeirError as exc:
            return exc.http_status, _error(exc.message, exc.headers)
        except Exception:
            logger.exception("inference failed")
            return 500, _error("internal error in the gateway", {})


def _head(media_type: str, content: bytes, extra: dict[str, str]) -> list[bytes]:
    lines = [b"content-type: %s\r\ncontent-length: %d\r\n" % (media_type.encode(), len(content))]
    lines.extend(b"%s: %s\r\n" % (k.encode(), v.encode("latin-1")) for k, v in extra.items())
    lines.append(content)
    return lines


def _error(message: str, headers: dict[str, str]) -> list[bytes]:
    return _head("application/json", orjson.dumps({"error": message}), headers)


def exchange_for(
    method: bytes,
    url: bytes,
    raw_headers: list[tuple[bytes, bytes]],
    keep_alive: bool,
) -> InferExchange | None:
    """An exchange for an infer request the protocol can answer itself, else None."""
    match = INFER_TARGET.fullmatch(url) if method == b"POST" and url.isascii() else None
    if match is None:
        return None
    headers = {name: value.decode("latin-1") for name, value in raw_headers if name in _WANTED}
    model, version = match.group(1, 2)
    return InferExchange(
        model.decode("ascii"),
        None if version is None else version.decode("ascii"),
        headers,
        keep_alive,
    )
