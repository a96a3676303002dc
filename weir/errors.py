"""Errors that carry their HTTP meaning.

A service raises one of these; the gateway maps it once to a status code and renders it in
the KServe error shape ``{"error": "..."}``. Errors cross the mesh as ``(kind, message)`` so
a worker's failure reaches the client with the same meaning it had where it happened.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """The meaning of an error, independent of the transport that carries it."""

    INVALID = "invalid"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    CANCELED = "canceled"
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"


HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TIMEOUT: 504,
    ErrorKind.CANCELED: 499,  # nginx's "client closed request": nobody reads it
    ErrorKind.UNSUPPORTED: 501,
    ErrorKind.INTERNAL: 500,
}


class WeirError(Exception):
    """Base of every error Weir reports to a client."""

    kind: ErrorKind = ErrorKind.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.kind]

    @property
    def pair(self) -> tuple[str, str]:
        """``(kind, message)``: how the error crosses the mesh (:meth:`of_kind` reads it)."""
        return (self.kind, self.message)

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers that go with this error's response."""
        return {}

    @staticmethod
    def of_kind(kind: str, message: str) -> WeirError:
        """Rebuild an error that crossed the mesh as ``(kind, message)``."""
        try:
            cls = _BY_KIND[ErrorKind(kind)]
        except ValueError:
            cls = ServerError
        return cls(message)


class InvalidInput(WeirError):
    """The request is malformed or does not match the model's config (400)."""

    kind = ErrorKind.INVALID


class NotFound(WeirError):
    """Unknown model or version (404)."""

    kind = ErrorKind.NOT_FOUND


class BodyTooLarge(WeirError):
    """The request body is over the configured limit (413)."""

    kind = ErrorKind.TOO_LARGE


class Unavailable(WeirError):
    """The mesh cannot take the request now (503); the client may retry after a while."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


class Unauthorized(WeirError):
    """A missing or wrong bearer token (401)."""

    kind = ErrorKind.UNAUTHORIZED

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class DeadlineExceeded(WeirError):
    """The request's deadline passed before it was answered (504)."""

    kind = ErrorKind.TIMEOUT
    # Triton's words for a request whose timeout expired while queued; clients match on it.
    TRITON_TEXT = "Request timeout expired"


class Canceled(WeirError):
    """The client left (HTTP disconnect, gRPC cancel) before its answer; nobody reads this.

    Counted in the metrics as ``reason="CANCELED"``, Triton's name.
    """

    kind = ErrorKind.CANCELED


class Unsupported(WeirError):
    """What an endpoint cannot do for a model (Triton's UNSUPPORTED): 501, UNIMPLEMENTED."""

    kind = ErrorKind.UNSUPPORTED


class ServerError(WeirError):
    """A failure inside Weir or the model (500)."""

    kind = ErrorKind.INTERNAL


class ConfigError(Exception):
    """A model repository entry is invalid; the message names the file and the field."""


_BY_KIND: dict[ErrorKind, type[WeirError]] = {
    cls.kind: cls
    for cls in (
        InvalidInput,
        Unauthorized,
        NotFound,
        BodyTooLarge,
        Unavailable,
        DeadlineExceeded,
        Canceled,
        Unsupported,
        ServerError,
    )
}
