"""TorchServe's gRPC inference API (``org.pytorch.serve.grpc.inference``), on its own port.

TorchServe's clients call ``InferenceAPIsService`` on port 7070 with stubs generated from
its ``inference.proto``. The messages are built here from descriptors written in Python
(same package, names and field numbers, so the bytes on the wire are TorchServe's), with no
generated code: ``Ping``, ``Predictions`` (the handler's answer) and ``StreamPredictions``
(each part a handler streams with ``send_intermediate_predict_response`` as it comes, then
its answer, as TorchServe's frontend sends them). ``StreamPredictions2`` (sequences)
answers UNIMPLEMENTED.

A prediction is the HTTP one (:func:`gateway.torchserve.inference_routes.prediction`):
each entry of ``input`` is a parameter of the request, as TorchServe's frontend makes it. It
takes the inference token, when one is set, from the ``authorization`` metadata entry, as
Weir's KServe v2 gRPC does. A failure ends the call with the gRPC status TorchServe maps its
HTTP status to, and the message as its description.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, empty_pb2
from starlette.datastructures import Headers

from gateway.auth import Scope, check_authorization, required_token
from gateway.health import ready_when, serves_all
from gateway.parts import parts_then_answer
from gateway.state import GatewayState
from gateway.torchserve.grpc_messages import (
    Context,
    Field,
    add_message,
    authorization,
    classes,
    file_proto,
    status_code,
)
from gateway.torchserve.inference_routes import Answer, Prediction, bodiless_prediction
from weir.errors import WeirError
from weir.torchserve.envelope import Parameter

PACKAGE = "org.pytorch.serve.grpc.inference"
SERVICE = f"{PACKAGE}.InferenceAPIsService"


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = file_proto(PACKAGE, "inference")
    request = add_message(
        proto, "PredictionsRequest", [("model_name", "string"), ("model_version", "string")]
    )
    entry = request.nested_type.add(name="InputEntry")
    entry.field.add(name="key", number=1, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=Field.TYPE_BYTES, label=Field.LABEL_OPTIONAL)
    entry.options.map_entry = True
    request.field.add(
        name="input",
        number=3,
        type=Field.TYPE_MESSAGE,
        label=Field.LABEL_REPEATED,
        type_name=f".{PACKAGE}.PredictionsRequest.InputEntry",
    )
    add_message(proto, "PredictionResponse", [("prediction", "bytes")])
    add_message(proto, "TorchServeHealthResponse", [("health", "string")])
    return proto


MESSAGES = classes(_file())
PredictionsRequest = MESSAGES["PredictionsRequest"]
PredictionResponse = MESSAGES["PredictionResponse"]
TorchServeHealthResponse = MESSAGES["TorchServeHealthResponse"]


class TorchServeInference:
    """The service's calls, answered from the gateway's state."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def ping(self, _: Any, context: Context) -> Any:
        state = self.state
        try:
            healthy = await ready_when(state, functools.partial(serves_all, state))
        except WeirError:
            healthy = False
        status, code = ("Healthy", 200) if healthy else ("Unhealthy", 500)
        return TorchServeHealthResponse(health=f'{{"status": "{status}", "code": {code}}}')

    async def predictions(self, request: Any, context: Context) -> Any:
        """The handler's answer (what it streams before it is not sent)."""
        asked = await self._asked(request, context)
        try:
            answer = await bodiless_prediction(self.state, asked)
        except WeirError as exc:
            await context.abort(status_code(exc.http_status), exc.message)
        return await _response(answer, context)

    async def stream_predictions(self, request: Any, context: Context) -> AsyncIterator[Any]:
        """Each part the handler streams as it comes, then its answer."""
        asked = await self._asked(request, context)
        run = functools.partial(bodiless_prediction, self.state, asked)
        try:
            async for item in parts_then_answer(run):
                yield await _response(item.value, context)
        except WeirError as exc:
            await context.abort(status_code(exc.http_status), exc.message)

    async def _asked(self, request: Any, context: Context) -> Prediction:
        """The prediction ``request`` asks for, once its token (if one is set) is checked."""
        if not request.model_name:
            await context.abort(grpc.StatusCode.INTERNAL, "Parameter model_name is required.")
        token = required_token(self.state.settings, Scope.INFERENCE)
        if token is not None:
            try:
                check_authorization(authorization(context), token, Scope.INFERENCE)
            except WeirError as exc:
                await context.abort(status_code(exc.http_status), exc.message)
        parameters = tuple(Parameter(k, "", bytes(v)) for k, v in request.input.items())
        return Prediction(
            request.model_name, request.model_version or None, False, Headers(), b"", parameters
        )

    async def stream_predictions2(self, _: Any, context: Context) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "StreamPredictions2 (sequences) is not served by Weir"
        )


async def _response(answer: Answer, context: Context) -> Any:
    """One message of the answer; a status other than 200 ends the call with it."""
    if answer.status != 200:
        await context.abort(status_code(answer.status), answer.content.decode(errors="replace"))
    return PredictionResponse(prediction=answer.content)


def handlers(state: GatewayState) -> grpc.GenericRpcHandler:
    """The service's method handlers, for a ``grpc.aio`` server."""
    service = TorchServeInference(state)
    read, write = PredictionsRequest.FromString, PredictionResponse.SerializeToString
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Ping": grpc.unary_unary_rpc_method_handler(
                service.ping,
                request_deserializer=empty_pb2.Empty.FromString,
                response_serializer=TorchServeHealthResponse.SerializeToString,
            ),
            "Predictions": grpc.unary_unary_rpc_method_handler(
                service.predictions, request_deserializer=read, response_serializer=write
            ),
            "StreamPredictions": grpc.unary_stream_rpc_method_handler(
                service.stream_predictions, request_deserializer=read, response_serializer=write
            ),
            "StreamPredictions2": grpc.stream_stream_rpc_method_handler(
                service.stream_predictions2, request_deserializer=read, response_serializer=write
            ),
        },
    )
