"""TorchServe's response shapes: ``{"status": ...}`` and ``{"code", "type", "message"}``.

TorchServe's clients read the error's ``code`` and ``message``; ``type`` names the
exception TorchServe's frontend would have raised for the same failure.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

from weir.errors import ErrorKind, WeirError

JSON = "application/json"

ERROR_TYPES: dict[ErrorKind, str] = {
    ErrorKind.INVALID: "BadRequestException",
    ErrorKind.UNAUTHORIZED: "InvalidKeyException",
    ErrorKind.NOT_FOUND: "ModelNotFoundException",
    ErrorKind.TOO_LARGE: "TooLongFrameException",
    ErrorKind.UNAVAILABLE: "ServiceUnavailableException",
    ErrorKind.TIMEOUT: "RequestTimeoutException",
    ErrorKind.CANCELED: "RequestCanceledException",
    ErrorKind.UNSUPPORTED: "MethodNotAllowedException",
    ErrorKind.INTERNAL: "InternalServerException",
}
TYPES_BY_STATUS = {
    400: "BadRequestException",
    403: "InvalidModelVersionException",
    404: "ModelNotFoundException",
    405: "MethodNotAllowedException",
    409: "ConflictStatusException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}


def status_response(message: str, status: int = 200) -> Response:
    """TorchServe's ``StatusResponse``: ``{"status": "..."}``."""
    return Response(
        orjson.dumps({"status": message}, option=orjson.OPT_INDENT_2), status, None, JSON
    )


def error_response(
    status: int, message: str, error_type: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """TorchServe's ``ErrorResponse``."""
    body = {
        "code": status,
        "type": error_type or TYPES_BY_STATUS.get(status, "InternalServerException"),
        "message": message,
    }
    return Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), status, headers, JSON)


def weir_error_response(exc: WeirError) -> Response:
    """A Weir error in TorchServe's shape, with Weir's status and headers (Retry-After)."""
    return error_response(exc.http_status, exc.message, ERROR_TYPES[exc.kind], exc.headers)
