"""One inference, from the HTTP request to the HTTP response.

Shared by the fast path (plain ASGI, see :mod:`gateway.fastpath`) and the FastAPI route;
:func:`execute`, the part after parsing, is shared with gRPC (:mod:`gateway.grpc_service`).
"""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import Response

from gateway import codec
from gateway.codec import InferBody
from gateway.state import GatewayState
from gateway.validation import check_request, precheck_input
from weir.errors import BodyTooLarge, InvalidInput, WeirError
from weir.repository import ModelEntry
from weir.tensors import Tensor
from weir.wire import InferReply

HEADER_LENGTH = "inference-header-content-length"
JSON = "application/json"


async def run_infer(
    state: GatewayState, request: Request, model: str, version: str | None
) -> Response:
    """Validate, queue, await and render one inference; WeirError for any failure."""
    entry, version = state.repository.resolve(model, version)
    try:
        raw = await _read_body(request, state.settings.body_limit_bytes)
        precheck = functools.partial(precheck_input, entry.config)
        body = codec.parse_infer_body(raw, _header_length(request), precheck)
        reply = await execute(state, entry, version, body)
    except WeirError as exc:
        state.metrics.failed(entry.name, version, exc.kind)
        raise
    state.metrics.answered(entry.name, version, reply)
    content, header_length = codec.render_infer_response(
        entry.name, version, body.id, _outputs(body, reply.outputs)
    )
    if header_length is None:
        return Response(content, media_type=JSON)
    return Response(
        content,
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(header_length)},
    )


async def execute(
    state: GatewayState, entry: ModelEntry, version: str, body: InferBody
) -> InferReply:
    """Check a parsed request against its model, queue it and await its reply.

    The transport-independent part of an inference, shared by HTTP and gRPC: the same
    validation, admission and deadline. WeirError for any failure; the caller counts the
    outcome in the metrics.
    """
    batch = check_request(entry.config, body)
    reply = await state.mesh.infer(entry, version, body, batch)
    reply.raise_for_error()
    return reply


def _outputs(body: InferBody, outputs: dict[str, Tensor]) -> list[tuple[str, Tensor, bool]]:
    default = body.binary_output_default
    if not body.outputs:
        return [(name, tensor, default) for name, tensor in outputs.items()]
    return [
        (o.name, outputs[o.name], default if o.binary is None else o.binary) for o in body.outputs
    ]


def _header_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:
        raise InvalidInput(f"Inference-Header-Content-Length {raw[:32]!r} is not a byte count")
    return int(raw)


async def _read_body(request: Request, limit_bytes: int) -> bytes:
    """The body, refused as soon as it is known to exceed ``limit_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(int(declared), limit_bytes)
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit_bytes:
            raise _too_large(received, limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit_bytes: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body of {size} bytes or more exceeds the limit of {limit_bytes}")
