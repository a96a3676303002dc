"""Triton's generate extension: ``/generate`` and ``/generate_stream``, text in and out.

``POST /v2/models/{m}[/versions/{v}]/generate`` takes one JSON object. Each key that names
one of the model's inputs is that input: a string, number or boolean, or a flat array of
them, shaped as Triton shapes it (the model's fixed dimensions take the elements they need;
the innermost variable dimension the rest, the batch dimension and any other variable one
1). Every other key is a request parameter (a string, number or boolean); the object under
``parameters`` is read the same way, so an input may be given there too. The answer is one
JSON object: ``model_name``, ``model_version`` and each output by name, one element as
itself and several as a flat array (``BYTES`` as strings).

``/generate_stream`` answers the same request as Server-Sent Events
(``text/event-stream``): one ``data: {...}`` event per response, as they come. A decoupled
model (:mod:`gateway.grpc_parts`) sends one per part and its last; any other model one. A
request that fails before its first response gets the JSON error and status of any
request; one that fails after it, an event ``data: {"error": "..."}``, after which the
stream ends (its status is already 200, as Triton's). ``/generate`` answers a decoupled
model with its last response.
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from starlette.responses import StreamingResponse

from gateway.auth import inference_scope
from gateway.codec import InferBody
from gateway.disconnect import follow
from gateway.inference import execute, read_body
from gateway.json_data import tensor_from_json
from gateway.parts import PartListener, Streamed, parts_then_answer
from gateway.state import GatewayState, gateway_state
from gateway.validation import precheck_input
from weir import datatypes
from weir.config import ModelConfig
from weir.errors import InvalidInput, WeirError
from weir.repository import ModelEntry
from weir.wire import InferReply

router = APIRouter()
INFERENCE = [Depends(inference_scope)]
EVENT_STREAM = "text/event-stream; charset=utf-8"
PARAMETERS = "parameters"


@router.post("/v2/models/{model}/generate", dependencies=INFERENCE)
@router.post("/v2/models/{model}/versions/{version}/generate", dependencies=INFERENCE)
async def generate(request: Request, model: str, version: str | None = None) -> Response:
    state = gateway_state(request)
    entry, version = state.repository.resolve(model, version)
    body = await _body(state, request, entry, version)
    parts: list[InferReply] = []
    reply = await _run(state, request, entry, version, body, parts.append)
    if not reply.outputs and parts:  # ended with no last response: its last part is
        reply = parts[-1]
    return Response(orjson.dumps(answer(entry, version, reply)), media_type="application/json")


@router.post("/v2/models/{model}/generate_stream", dependencies=INFERENCE)
@router.post("/v2/models/{model}/versions/{version}/generate_stream", dependencies=INFERENCE)
async def generate_stream(request: Request, model: str, version: str | None = None) -> Response:
    state = gateway_state(request)
    entry, version = state.repository.resolve(model, version)
    body = await _body(state, request, entry, version)
    run = functools.partial(_run, state, request, entry, version, body)
    stream = parts_then_answer(run)
    first = await anext(stream)  # a failure before any response is raised here
    events = _events(entry, version, first, stream)
    return StreamingResponse(events, media_type=EVENT_STREAM)


async def _body(
    state: GatewayState, request: Request, entry: ModelEntry, version: str
) -> InferBody:
    try:
        raw = await read_body(request, state.settings.body_limit_bytes)
        return generate_body(entry.config, raw)
    except WeirError as exc:
        state.metrics.failed(entry.name, version, exc.kind)
        raise


async def _run(
    state: GatewayState,
    request: Request,
    entry: ModelEntry,
    version: str,
    body: InferBody,
    on_part: Callable[[InferReply], None] | None,
) -> InferReply:
    parts: PartListener | None = on_part if entry.config.decoupled else None
    try:
        reply = await follow(request.scope, execute(state, entry, version, body, parts))
    except WeirError as exc:
        state.metrics.failed(entry.name, version, exc.kind)
        raise
    state.metrics.answered(entry.name, version, reply)
    return reply


async def _events(
    entry: ModelEntry,
    version: str,
    first: Streamed[InferReply],
    rest: AsyncIterator[Streamed[InferReply]],
) -> AsyncIterator[bytes]:
    try:
        if _sent(first):
            yield _event(answer(entry, version, first.value))
        async for item in rest:
            if _sent(item):
                yield _event(answer(entry, version, item.value))
    except WeirError as exc:
        yield _event({"error": exc.message})
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def _sent(item: Streamed[InferReply]) -> bool:
    # A decoupled request ended with no last response has nothing to send at its end.
    return not item.last or bool(item.value.outputs)


def _event(content: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(content) + b"\n\n"


def generate_body(config: ModelConfig, raw: bytes) -> InferBody:
    """The infer request a generate request stands for; InvalidInput when it cannot."""
    try:
        request = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the generate request is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise InvalidInput("the generate request must be a JSON object")
    body = InferBody(inputs={})
    _read_members(config, request, body, top=True)
    return body


def _read_members(config: ModelConfig, members: dict[str, Any], body: InferBody, top: bool) -> None:
    for key, value in members.items():
        if top and key == PARAMETERS:
            if not isinstance(value, dict):
                raise InvalidInput("'parameters' must be a JSON object")
            _read_members(config, value, body, top=False)
        elif config.input_spec(key) is not None:
            if key in body.inputs:
                raise InvalidInput(f"input '{key}' is given twice")
            body.inputs[key] = _tensor(config, key, value)
        elif isinstance(value, str | int | float | bool):
            body.parameters[key] = value
        else:
            raise InvalidInput(
                f"'{key}' is no input of model '{config.name}', and a parameter must be a "
                "string, number or boolean"
            )


def _tensor(config: ModelConfig, name: str, value: Any) -> Any:
    spec = config.input_spec(name)
    assert spec is not None
    elements = value if isinstance(value, list) else [value]
    if any(isinstance(e, list | dict) for e in elements):
        raise InvalidInput(f"input '{name}' must be a value or a flat array of values")
    shape = _shape(name, config.full_shape(spec), len(elements))
    precheck_input(config, name, spec.datatype, shape)
    return tensor_from_json(name, spec.datatype, shape, elements)


def _shape(name: str, dims: list[int], count: int) -> tuple[int, ...]:
    """Triton's: fixed dimensions take their share, the innermost variable one the rest."""
    fixed = math.prod(d for d in dims if d != -1)
    if fixed == 0 or count % fixed:
        raise InvalidInput(f"The schema can not convert input '{name}' to tensor with proper shape")
    rest = count // fixed
    shape = list(dims)
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], rest = rest, 1
    if rest != 1:
        raise InvalidInput(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def answer(entry: ModelEntry, version: str, reply: InferReply) -> dict[str, Any]:
    """One generate response: the model, its version and each output by name."""
    content: dict[str, Any] = {"model_name": entry.name, "model_version": version}
    for name, tensor in reply.outputs.items():
        if tensor.datatype == datatypes.BYTES:
            values = [e.decode(errors="replace") for e in tensor.to_numpy().reshape(-1)]
        else:
            values = tensor.to_numpy().reshape(-1).tolist()
        content[name] = values[0] if len(values) == 1 else values
    return content
