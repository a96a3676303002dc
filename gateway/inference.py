"""One inference, from the HTTP request to the HTTP response.

Shared by the fast path (plain ASGI, see :mod:`gateway.fastpath`) and the FastAPI route;
:func:`execute`, the part after parsing, is shared with gRPC (:mod:`gateway.grpc_service`).
The body is decoded first (gzip, deflate: :mod:`gateway.compression`); a header length of 0
is Triton's raw binary request (:mod:`gateway.raw_binary`).
"""

from __future__ import annotations

import asyncio
import functools
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway import (
    classification,
    codec,
    compression,
    json_bounds,
    json_plain,
    offload,
    shared_memory,
)
from gateway.codec import InferBody
from gateway.compression import BoundedDecoder, Coding
from gateway.disconnect import SCOPE_KEY, Disconnect
from gateway.parts import HTTP_DECOUPLED, PartListener, refuse_decoupled
from gateway.raw_binary import parse_raw_body
from gateway.response_cache import AnswerCache, request_key
from gateway.state import GatewayState
from gateway.validation import check_request, model_parameters, precheck_input
from weir.errors import BodyTooLarge, Canceled, InvalidInput, WeirError
from weir.repository import ModelEntry
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.wire import InferReply

HEADER_LENGTH = "inference-header-content-length"
JSON = "application/json"
OCTET_STREAM = "application/octet-stream"
# Responses smaller than this compress on the event loop; larger ones in a thread.
COMPRESS_INLINE_BYTES = 256 * 1024
# Requests whose inputs are smaller than this get their response cache key on the event loop.
HASH_INLINE_BYTES = 1024 * 1024


async def run_infer(
    state: GatewayState, request: Request, model: str, version: str | None
) -> Response:
    """Validate, queue, await and render one inference; WeirError for any failure."""
    entry, version = state.repository.resolve(model, version)
    try:
        raw = await read_body(request, state.settings.body_limit_bytes)
    except WeirError as exc:
        state.metrics.failed(entry.name, version, exc.kind)
        raise
    headers = request.headers
    content, header_length = await infer_body(
        state, entry, version, raw, headers.get(HEADER_LENGTH), request.scope.get(SCOPE_KEY)
    )
    content, extra, media_type = await encode_response(
        content, header_length, headers.get("accept-encoding")
    )
    return Response(content, media_type=media_type, headers=extra)


async def infer_body(
    state: GatewayState,
    entry: ModelEntry,
    version: str,
    raw: bytes,
    header_length: str | None,
    disconnect: Disconnect | None,
) -> tuple[bytes, int | None]:
    """One inference from its read (decoded) body to its rendered response body.

    ``header_length`` is the ``Inference-Header-Content-Length`` header's value; the answer
    is abandoned (Canceled) when ``disconnect`` fires. The outcome is counted in the
    metrics; WeirError for any failure.
    """
    try:
        refuse_decoupled(entry, HTTP_DECOUPLED)
        body = await _parse_body(state, entry, raw, _header_length(header_length))
        running = execute(state, entry, version, body)
        reply = await (running if disconnect is None else disconnect.follow(running))
        shared = shared_memory.write_outputs(body.shared_outputs, reply.outputs)
    except WeirError as exc:
        state.metrics.failed(entry.name, version, exc.kind)
        raise
    state.metrics.answered(entry.name, version, reply)
    return codec.render_infer_response(
        entry.name, version, body.id, _outputs(body, reply.outputs), shared
    )


async def execute(
    state: GatewayState,
    entry: ModelEntry,
    version: str,
    body: InferBody,
    on_part: PartListener | None = None,
) -> InferReply:
    """Check a parsed request against its model, queue it and await its reply.

    The transport-independent part of an inference, shared by HTTP and gRPC: the same
    validation, admission and deadline. WeirError for any failure; the caller counts the
    outcome in the metrics. ``on_part`` takes the parts of a streamed answer (gateway.parts).
    """
    batch = check_request(entry.config, body)
    tracer = state.tracer
    traced = tracer is not None and tracer.sample(entry.name)
    # A sequence's answer depends on its state: never cached (a pipeline's stateful step).
    cacheable = entry.config.caches_responses and "sequence_id" not in body.parameters
    cache = state.cache if on_part is None and cacheable else None
    if cache is None:
        reply = await state.mesh.infer(entry, version, body, batch, on_part)
        reply.raise_for_error()
    else:
        reply = await _through_cache(state, cache, entry, version, body, batch)
    if traced and tracer is not None:
        tensors = (body.inputs, reply.outputs)
        tracer.record(entry.name, version, body.id, reply.ts, tensors)
    reply.outputs = classification.apply(entry, body, reply.outputs)
    _check_response_size(entry, reply.outputs, state.settings.response_limit_bytes)
    return reply


async def _through_cache(
    state: GatewayState,
    cache: AnswerCache,
    entry: ModelEntry,
    version: str,
    body: InferBody,
    batch: int,
) -> InferReply:
    """The kept answer to ``body`` or, failing that, the mesh's, kept for the next."""
    started_ns, arrived_ns = time.perf_counter_ns(), time.time_ns()
    wanted = [output.name for output in body.outputs]
    parameters = model_parameters(body.parameters)
    key_of = functools.partial(request_key, entry.name, version, body.inputs, wanted, parameters)
    large = sum(len(tensor.data) for tensor in body.inputs.values()) > HASH_INLINE_BYTES
    key = await asyncio.to_thread(key_of) if large else key_of()
    kept = await cache.lookup(key)
    looked_ns = time.perf_counter_ns() - started_ns
    counts = state.cache_counts
    if kept is not None:
        if counts is not None:
            counts.hit(entry.name, version, looked_ns, looked_ns)
        stamps = {Stamp.GATEWAY_IN: arrived_ns, Stamp.GATEWAY_OUT: time.time_ns()}
        return InferReply(body.id or "", entry.name, version, kept, ts=stamps)
    reply = await state.mesh.infer(entry, version, body, batch, None)
    reply.raise_for_error()
    keeping_ns = time.perf_counter_ns()
    await cache.keep(key, reply.outputs)
    if counts is not None:
        counts.miss(entry.name, version, looked_ns + time.perf_counter_ns() - keeping_ns)
    return reply


def _check_response_size(entry: ModelEntry, outputs: dict[str, Tensor], limit_bytes: int) -> None:
    """Refuse, before anything is rendered, a response whose outputs exceed the limit."""
    size = sum(len(tensor.data) for tensor in outputs.values())
    if size > limit_bytes:
        raise BodyTooLarge(
            f"the outputs of model '{entry.name}' hold {size} bytes, over the response limit "
            f"of {limit_bytes} bytes (WEIR_GATEWAY_RESPONSE_LIMIT_BYTES)"
        )


def _outputs(body: InferBody, outputs: dict[str, Tensor]) -> list[tuple[str, Tensor, bool]]:
    default = body.binary_output_default
    if not body.outputs:
        return [(name, tensor, default) for name, tensor in outputs.items()]
    return [
        (o.name, outputs[o.name], default if o.binary is None else o.binary) for o in body.outputs
    ]


def _header_length(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:
        raise InvalidInput(f"Inference-Header-Content-Length {raw[:32]!r} is not a byte count")
    return int(raw)


async def _parse_body(
    state: GatewayState, entry: ModelEntry, raw: bytes, header_length: int | None
) -> InferBody:
    """The body parsed: on the event loop when small, in a parse thread when large.

    JSON past what the model's inputs can need is refused before it is parsed.
    """
    if header_length == 0:  # Triton's raw binary request: the body is the one input's data
        return parse_raw_body(entry.config, raw)
    settings = state.settings
    bounds = json_bounds.for_body(entry.config, settings, len(raw))
    if header_length is None and len(raw) <= settings.parse_inline_bytes:
        # The common body, in one pass (json_plain), once within the JSON bound.
        if bounds is not None:
            json_bounds.check(raw, bounds)
            bounds = None  # checked: a body the general path takes is not scanned again
        plain = json_plain.parse(raw, entry.config)
        if plain is not None:
            return plain
    precheck = functools.partial(precheck_input, entry.config)
    shm = state.shared_memory
    parse = functools.partial(
        codec.parse_infer_body, raw, header_length, precheck, shm, entry.name, bounds
    )
    return await offload.parse(state.settings, len(raw), parse)


async def read_body(request: Request, limit_bytes: int) -> bytes:
    """The body, decoded, refused as soon as it is known to exceed ``limit_bytes``.

    The limit holds for the bytes received and, for a compressed body, for the decoded ones.
    """
    coding = compression.request_coding(request.headers.get("content-encoding"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise too_large(int(declared), limit_bytes)
    decoder = None if coding == Coding.IDENTITY else BoundedDecoder(coding, limit_bytes)
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit_bytes:
                raise too_large(received, limit_bytes)
            chunks.extend([chunk] if decoder is None else decoder.feed(chunk))
    except ClientDisconnect:
        raise Canceled("the client closed the connection before its body was read") from None
    if decoder is not None:
        decoder.finish()
    return b"".join(chunks)


async def encode_response(
    content: bytes, header_length: int | None, accept_encoding: str | None
) -> tuple[bytes, dict[str, str], str]:
    """The infer response's body, its extra headers and its media type.

    The body is compressed as ``accept_encoding`` (the request's header) prefers.
    """
    headers: dict[str, str] = {}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    coding = compression.response_coding(accept_encoding)
    if coding != Coding.IDENTITY:
        content = await _compress(content, coding)
        headers["Content-Encoding"] = coding.value
    return content, headers, JSON if header_length is None else OCTET_STREAM


async def _compress(content: bytes, coding: Coding) -> bytes:
    if len(content) < COMPRESS_INLINE_BYTES:
        return compression.compress(content, coding)
    # zlib lets go of the GIL: a large body compresses beside the event loop, not on it.
    return await asyncio.to_thread(compression.compress, content, coding)


def too_large(size: int, limit_bytes: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body of {size} bytes or more exceeds the limit of {limit_bytes}")
