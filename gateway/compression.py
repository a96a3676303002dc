"""HTTP content codings of infer bodies, as Triton reads and writes them: gzip and deflate.

A request with ``Content-Encoding: gzip`` or ``deflate`` is decoded as it arrives, a chunk
at a time, and never past the body limit: the limit counts decoded bytes, so a small body
that would inflate to gigabytes is refused (413) once it passes the limit, having cost no
more memory than the limit. As in Triton, both codings go through zlib's automatic header
detection, so gzip data sent as ``deflate`` (or zlib data as ``gzip``) decodes too. Any other
coding is a 415 that lists the supported ones in ``Accept-Encoding`` (RFC 7694).

A response is compressed when the request's ``Accept-Encoding`` prefers gzip or deflate
(``deflate`` meaning zlib's format, as tritonclient reads it); ``Inference-Header-Content-
Length`` still gives the JSON header's length before compression.
"""

from __future__ import annotations

import functools
import zlib
from enum import StrEnum

from weir.errors import BodyTooLarge, InvalidInput

# zlib's largest window, plus 32: detect a gzip or a zlib header (Triton's inflateInit2).
_AUTO_DETECT_WBITS = zlib.MAX_WBITS | 32
_GZIP_WBITS = zlib.MAX_WBITS | 16
SUPPORTED = "gzip, deflate"


class Coding(StrEnum):
    """The content codings an infer body may use."""

    IDENTITY = "identity"
    GZIP = "gzip"
    DEFLATE = "deflate"


class UnsupportedEncoding(InvalidInput):
    """A request body in a content coding Weir does not decode (415, RFC 7231 3.1.2.2)."""

    @property
    def http_status(self) -> int:
        return 415

    @property
    def headers(self) -> dict[str, str]:
        return {"Accept-Encoding": SUPPORTED}


def request_coding(content_encoding: str | None) -> Coding:
    """The coding a ``Content-Encoding`` header names; UnsupportedEncoding for others."""
    if not content_encoding:  # nearly every request: no enum lookup, no exception
        return Coding.IDENTITY
    raw = content_encoding
    try:
        return Coding(raw.strip().lower() or "identity")
    except ValueError:
        raise UnsupportedEncoding(  # Triton's words, then which codings Weir reads
            f"Unsupported compression type {raw[:64]!r} in Content-Encoding; supported: {SUPPORTED}"
        ) from None


class BoundedDecoder:
    """Inflates a gzip or deflate body chunk by chunk, never past ``limit_bytes`` of output."""

    def __init__(self, coding: Coding, limit_bytes: int) -> None:
        self.coding = coding
        self.limit_bytes = limit_bytes
        self.size = 0
        self._zlib = zlib.decompressobj(_AUTO_DETECT_WBITS)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The decoded bytes of ``chunk``; BodyTooLarge once they pass the limit."""
        pieces: list[bytes] = []
        data = chunk
        while data:
            if self._zlib.eof:
                raise InvalidInput(f"request body has data after the end of its {self.coding} data")
            # One byte past the limit is enough to know it is passed; zlib keeps the rest.
            piece = self._inflate(data, self.limit_bytes - self.size + 1)
            self.size += len(piece)
            if self.size > self.limit_bytes:
                raise decoded_too_large(self.limit_bytes)
            pieces.append(piece)
            data = self._zlib.unconsumed_tail or self._zlib.unused_data
        return pieces

    def finish(self) -> None:
        """Refuse a body that ended before its compressed data did."""
        if not self._zlib.eof:
            raise InvalidInput(f"request body ends before the end of its {self.coding} data")

    def _inflate(self, data: bytes, max_length: int) -> bytes:
        try:
            return self._zlib.decompress(data, max_length)
        except zlib.error as exc:
            raise InvalidInput(f"request body is not valid {self.coding} data: {exc}") from None


def decoded_too_large(limit_bytes: int) -> BodyTooLarge:
    # Triton's words ("exceeds the maximum allowed value"), which its tests match on.
    return BodyTooLarge(
        f"decompressed request body exceeds the maximum allowed value of {limit_bytes} bytes "
        "(WEIR_GATEWAY_BODY_LIMIT_BYTES)"
    )


def response_coding(accept_encoding: str | None) -> Coding:
    """The coding to answer in: the highest-weighted of identity, gzip and deflate.

    Triton's rule: ``q`` weights decide, the first listed wins a tie, ``q=0`` (or a weight
    that does not parse) never wins, and anything else named is ignored. A client sends the
    same header on every request, so the answer is remembered per header value.
    """
    if not accept_encoding:
        return Coding.IDENTITY
    return _preferred(accept_encoding)


@functools.lru_cache(maxsize=64)
def _preferred(accept_encoding: str) -> Coding:
    best, best_weight = Coding.IDENTITY, 0.0
    for item in accept_encoding.split(","):
        name, _, params = item.partition(";")
        coding = _known(name)
        weight = _weight(params)
        if coding is not None and weight > best_weight:
            best, best_weight = coding, weight
    return best


def _known(name: str) -> Coding | None:
    try:
        return Coding(name.strip().lower())
    except ValueError:
        return None


def _weight(params: str) -> float:
    params = params.strip().lower()
    if not params:
        return 1.0
    if not params.startswith("q="):
        return 0.0
    try:
        weight = float(params[2:])
    except ValueError:
        return 0.0
    return weight if 0.0 <= weight <= 1.0 else 0.0


def compress(data: bytes, coding: Coding) -> bytes:
    """``data`` in ``coding`` at zlib's default level (Triton's): gzip, or zlib's format."""
    if coding == Coding.GZIP:
        encoder = zlib.compressobj(wbits=_GZIP_WBITS)
        return encoder.compress(data) + encoder.flush()
    if coding == Coding.DEFLATE:
        return zlib.compress(data)
    return data
