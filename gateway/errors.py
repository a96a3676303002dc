"""Errors as the KServe protocol shows them: ``{"error": "..."}`` with the error's status."""

from __future__ import annotations

import orjson
from starlette.responses import Response


def error_response(
    message: str, status_code: int, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps({"error": message}), status_code, headers, media_type="application/json"
    )
