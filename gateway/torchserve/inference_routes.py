"""TorchServe's inference API on the HTTP port: ``/ping``, ``/predictions``, ``/explanations``.

A prediction is one request of the archive's model: its TorchServe request (parameters and
headers, :mod:`gateway.torchserve.requests`) travels as the ``ts_request`` input, is batched
by the batcher and run by the handler in a worker, and comes back as the bytes, status and
headers the handler gave it. Errors are in TorchServe's shape
(:mod:`gateway.torchserve.responses`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from starlette.datastructures import Headers

from gateway.auth import Scope, check_token
from gateway.codec import InferBody, RequestedOutput
from gateway.disconnect import follow
from gateway.health import ready_when, serves_all
from gateway.inference import execute, read_body
from gateway.parts import PartListener
from gateway.state import GatewayState, gateway_state
from gateway.torchserve.requests import ts_request
from gateway.torchserve.responses import error_response, status_response, weir_error_response
from gateway.torchserve.streaming import asgi_answer
from weir import datatypes
from weir.config import Backend
from weir.errors import BodyTooLarge, NotFound, Unavailable, WeirError
from weir.repository import ModelEntry, shown
from weir.tensors import Tensor
from weir.torchserve import envelope
from weir.torchserve.envelope import Parameter, TsRequest
from weir.wire import InferReply

logger = logging.getLogger(__name__)
router = APIRouter()
ANSWER = (envelope.RESPONSE, envelope.STATUS, envelope.HEADERS)
_NO_WORKER = (
    'Model "{model}" has no worker to serve inference request. Please use scale workers API '
    "to add workers."
)


@router.get("/ping")
async def ping(request: Request) -> Response:
    state = gateway_state(request)
    try:
        healthy = await ready_when(state, functools.partial(serves_all, state))
    except WeirError:
        healthy = False
    return status_response("Healthy" if healthy else "Unhealthy", 200 if healthy else 500)


# One route per method: OpenAPI gives each its own operation.
@router.post("/predictions/{model}")
@router.put("/predictions/{model}")
@router.post("/predictions/{model}/{version}")
@router.put("/predictions/{model}/{version}")
async def predictions(request: Request, model: str, version: str | None = None) -> Response:
    return await guarded_prediction(request, model, version, explain=False)


@router.post("/explanations/{model}")
@router.put("/explanations/{model}")
@router.post("/explanations/{model}/{version}")
@router.put("/explanations/{model}/{version}")
async def explanations(request: Request, model: str, version: str | None = None) -> Response:
    return await guarded_prediction(request, model, version, explain=True)


async def guarded_prediction(
    request: Request, model: str, version: str | None, explain: bool
) -> Response:
    """A prediction (or explanation), any failure answered in TorchServe's error shape.

    Reached straight from ASGI (:mod:`gateway.fastpath`); the routes above describe it and
    serve what the fast path hands on.
    """
    try:
        check_token(request, Scope.INFERENCE)
        return await predict(request, model, version, explain)
    except WeirError as exc:
        return weir_error_response(exc)
    except Exception:
        logger.exception("prediction failed")
        return error_response(500, "internal error in the gateway", "InternalServerException")


async def predict(request: Request, model: str, version: str | None, explain: bool) -> Response:
    """One TorchServe prediction; WeirError for any failure."""
    state = gateway_state(request)
    limit = state.settings.ts_max_request_size_bytes
    return await asgi_answer(
        functools.partial(
            prediction,
            state,
            Prediction(model, version, explain, request.headers, request.scope["query_string"]),
            functools.partial(read_body, request, limit),
            functools.partial(follow, request.scope),
        )
    )


@dataclass(frozen=True, slots=True)
class Prediction:
    """What a prediction request says besides its body."""

    model: str
    version: str | None
    explain: bool
    headers: Headers
    query: bytes
    # The request's parameters as given (gRPC's input map); None: made from the HTTP request.
    parameters: tuple[Parameter, ...] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """The handler's answer: its status, headers and bytes."""

    status: int
    headers: dict[str, str]
    content: bytes


async def prediction(
    state: GatewayState,
    asked: Prediction,
    read: Callable[[], Awaitable[bytes]],
    followed: Callable[[Awaitable[InferReply]], Awaitable[InferReply]],
    on_part: Callable[[Answer], None] | None = None,
) -> Answer:
    """One TorchServe prediction, however it arrived; WeirError for any failure.

    ``read`` gives the body (refusing one past ``max_request_size``); ``followed`` awaits
    the reply, cancelled when the client leaves. ``on_part`` takes each part the handler
    streams before its answer (gateway.torchserve.streaming); without it, only the answer.
    """
    entry, weir_version, registered = resolve(state, asked.model, asked.version)
    if registered:
        await _check_served(state, entry, weir_version)
    try:
        if asked.parameters is None:
            request = await ts_request(asked.headers, asked.query, await read(), asked.explain)
        else:
            request = TsRequest(list(asked.parameters), dict(asked.headers.items()))
        body = InferBody({envelope.TS_REQUEST: _element(entry, request)}, _wanted())
        parts = None if on_part is None else _parts(state, on_part)
        reply = await followed(execute(state, entry, weir_version, body, parts))
        answer = _answer(state, reply)
    except WeirError as exc:
        state.metrics.failed(entry.name, weir_version, exc.kind)
        raise
    state.metrics.answered(entry.name, weir_version, reply)
    return answer


async def bodiless_prediction(
    state: GatewayState, asked: Prediction, on_part: Callable[[Answer], None] | None = None
) -> Answer:
    """A prediction with no HTTP body nor client connection behind it (gRPC, describe)."""
    return await prediction(state, asked, _no_body, _awaited, on_part)


async def _no_body() -> bytes:
    return b""


def _awaited(reply: Awaitable[InferReply]) -> Awaitable[InferReply]:
    return reply


def resolve(state: GatewayState, model: str, version: str | None) -> tuple[ModelEntry, str, bool]:
    """The archive's model, the Weir version a request goes to, and whether it is the store's.

    One look at the store's records per request. A model of the store that is registered
    and not loaded (0 workers) is TorchServe's 503.
    """
    registered, weir_version = state.torchserve.lookup(model, version)
    if model not in state.repository.models and registered:
        raise Unavailable(_NO_WORKER.format(model=shown(model)))
    try:
        entry, weir_version = state.repository.resolve(model, weir_version)
    except NotFound:
        if version is None or model not in state.repository.models:
            raise NotFound(f"Model not found: {shown(model)}") from None
        raise NotFound(
            f"Model version: {shown(version)} does not exist for model: {shown(model)}"
        ) from None
    if entry.config.backend is not Backend.TORCHSERVE:
        raise NotFound(
            f"Model not found: {shown(model)} (it is no TorchServe archive: ask it through "
            f"/v2/models/{shown(model)}/infer)"
        )
    return entry, weir_version, registered


async def _check_served(state: GatewayState, entry: ModelEntry, version: str) -> None:
    """A model of the store that no live worker runs is TorchServe's 503, at once."""
    if state.catalog.view.serves(entry.name, version):
        return
    # The control loop's view may be a refresh old: ask the workers' heartbeats themselves.
    if not await ready_when(state, lambda served: (entry.name, version) in served):
        message = _NO_WORKER.format(model=shown(entry.name))
        failure = state.catalog.failed.get((entry.name, version))
        raise Unavailable(message if failure is None else f"{message} Its load failed: {failure}")


def _wanted() -> list[RequestedOutput]:
    return [RequestedOutput(name) for name in ANSWER]


def _element(entry: ModelEntry, request: envelope.TsRequest) -> Tensor:
    # One BYTES element, serialized as such: no object array on the way.
    shape = (1, 1) if entry.config.max_batch_size > 0 else (1,)
    return Tensor(
        datatypes.BYTES, shape, datatypes.serialize_bytes([envelope.pack_request(request)])
    )


def _parts(state: GatewayState, on_part: Callable[[Answer], None]) -> PartListener:
    def take(reply: InferReply) -> None:
        on_part(_answer(state, reply))  # each part within max_response_size

    return take


def _answer(state: GatewayState, reply: InferReply) -> Answer:
    content = _first(reply.outputs[envelope.RESPONSE])
    limit = state.settings.ts_max_response_size_bytes
    if len(content) > limit:
        raise BodyTooLarge(
            f"the response of {len(content)} bytes exceeds max_response_size ({limit} bytes)"
        )
    status = int(reply.outputs[envelope.STATUS].to_numpy().reshape(-1)[0])
    headers = envelope.unpack_headers(_first(reply.outputs[envelope.HEADERS]))
    return Answer(status, headers, content)


def _first(tensor: Tensor) -> bytes:
    if tensor.datatype == datatypes.BYTES:
        return datatypes.deserialize_bytes(tensor.data)[0]
    return bytes(tensor.to_numpy().reshape(-1)[0])
