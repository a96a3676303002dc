"""How a TorchServe request and its answer cross the mesh as tensors.

A model served from a TorchServe archive has a fixed signature (:data:`INPUTS`,
:data:`OUTPUTS`), so it batches and routes like any model:

- ``body`` (BYTES, one element per request): the raw request body, as a KServe v2 client
  sends it. The handler gets ``{"body": bytearray(...)}``.
- ``ts_request`` (BYTES, one element per request): a whole TorchServe request as the
  gateway's ``/predictions`` route received it (every input parameter with its name and
  content type, and the request headers), packed by :func:`pack_request`.

A request carries one of the two. Each answer has three outputs: ``response`` (the bytes
the handler's result serializes to, as TorchServe serializes it), ``status`` (INT32, the
HTTP status the handler set, 200 by default) and ``headers`` (BYTES, a JSON object of the
response headers the handler set, ``content-type`` among them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
import orjson

BODY = "body"
TS_REQUEST = "ts_request"
RESPONSE = "response"
STATUS = "status"
HEADERS = "headers"

# The config entries of that signature (dims exclude the batch dimension).
INPUTS: list[dict[str, Any]] = [
    {"name": BODY, "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    {"name": TS_REQUEST, "data_type": "TYPE_STRING", "dims": [1], "optional": True},
]
OUTPUTS: list[dict[str, Any]] = [
    {"name": RESPONSE, "data_type": "TYPE_STRING", "dims": [1]},
    {"name": STATUS, "data_type": "TYPE_INT32", "dims": [1]},
    {"name": HEADERS, "data_type": "TYPE_STRING", "dims": [1]},
]


@dataclass(slots=True)
class Parameter:
    """One input parameter of a TorchServe request: the body, a form field or a file."""

    name: str
    content_type: str
    value: bytes


@dataclass(slots=True)
class TsRequest:
    """A TorchServe request as its handler sees it: parameters and request headers."""

    parameters: list[Parameter] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)


def pack_request(request: TsRequest) -> bytes:
    """The ``ts_request`` element of one request."""
    parameters = [[p.name, p.content_type, p.value] for p in request.parameters]
    return cast(bytes, msgpack.packb([parameters, request.headers], use_bin_type=True))


def unpack_request(data: bytes) -> TsRequest:
    """Read a ``ts_request`` element; a malformed one is a :class:`ValueError`."""
    try:
        parameters, headers = msgpack.unpackb(data, raw=False)
        return TsRequest(
            [Parameter(str(n), str(t), bytes(v)) for n, t, v in parameters],
            {str(k): str(v) for k, v in headers.items()},
        )
    except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed {TS_REQUEST} element: {exc}") from None


def pack_headers(headers: dict[str, str]) -> bytes:
    """The ``headers`` element of one answer."""
    return orjson.dumps(headers)


def unpack_headers(data: bytes) -> dict[str, str]:
    """Read a ``headers`` element (an empty or malformed one is no headers)."""
    try:
        value = orjson.loads(data) if data else {}
    except orjson.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
