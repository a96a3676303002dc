"""TorchServe's gRPC inference API (``org.pytorch.serve.grpc.inference``), on its own port.

TorchServe's clients call ``InferenceAPIsService`` on port 7070 with stubs generated from
its ``inference.proto``. The messages are built here from descriptors written in Python
(same package, names and field numbers, so the bytes on the wire are TorchServe's), with no
generated code: ``Ping``, ``Predictions`` and ``StreamPredictions`` (one answer; Weir does
not stream a handler's intermediate answers). ``StreamPredictions2`` (sequences) answers
UNIMPLEMENTED.

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
from google.protobuf import descriptor_pb2, descriptor_pool, empty_pb2, message_factory
from starlette.datastructures import Headers

from gateway.auth import Scope, check_authorization, required_token
from gateway.health import ready_when, serves_all
from gateway.state import GatewayState
from gateway.torchserve.inference_routes import Prediction, prediction
from weir.errors import WeirError
from weir.torchserve.envelope import Parameter

Context = grpc.aio.ServicerContext[Any, Any]
PACKAGE = "org.pytorch.serve.grpc.inference"
SERVICE = f"{PACKAGE}.InferenceAPIsService"
# TorchServe's mapping of HTTP statuses to gRPC's.
_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="weir/torchserve/inference.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/empty.proto"],
    )
    request = proto.message_type.add(name="PredictionsRequest")
    request.field.add(name="model_name", number=1, type=field.TYPE_STRING)
    request.field.add(name="model_version", number=2, type=field.TYPE_STRING)
    entry = request.nested_type.add(name="InputEntry")
    entry.field.add(name="key", number=1, type=field.TYPE_STRING)
    entry.field.add(name="value", number=2, type=field.TYPE_BYTES)
    entry.options.map_entry = True
    request.field.add(
        name="input",
        number=3,
        type=field.TYPE_MESSAGE,
        label=field.LABEL_REPEATED,
        type_name=f".{PACKAGE}.PredictionsRequest.InputEntry",
    )
    response = proto.message_type.add(name="PredictionResponse")
    response.field.add(name="prediction", number=1, type=field.TYPE_BYTES)
    health = proto.message_type.add(name="TorchServeHealthResponse")
    health.field.add(name="health", number=1, type=field.TYPE_STRING)
    for message in proto.message_type:
        for each in message.field:
            if not each.label:
                each.label = field.LABEL_OPTIONAL
    return proto


def _messages() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(empty_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(_file())
    names = ("PredictionsRequest", "PredictionResponse", "TorchServeHealthResponse")
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in names
    }


MESSAGES = _messages()
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
        if not request.model_name:
            await context.abort(grpc.StatusCode.INTERNAL, "Parameter model_name is required.")
        parameters = tuple(Parameter(k, "", bytes(v)) for k, v in request.input.items())
        asked = Prediction(
            request.model_name, request.model_version or None, False, Headers(), b"", parameters
        )
        try:
            token = required_token(self.state.settings, Scope.INFERENCE)
            if token is not None:
                check_authorization(_authorization(context), token, Scope.INFERENCE)
            answer = await prediction(self.state, asked, _no_body, _awaited)
        except WeirError as exc:
            await context.abort(_code(exc.http_status), exc.message)
        if answer.status != 200:
            await context.abort(_code(answer.status), answer.content.decode(errors="replace"))
        return PredictionResponse(prediction=answer.content)

    async def stream_predictions(self, request: Any, context: Context) -> AsyncIterator[Any]:
        yield await self.predictions(request, context)

    async def stream_predictions2(self, _: Any, context: Context) -> Any:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "StreamPredictions2 (sequences) is not served by Weir"
        )


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


def _authorization(context: Context) -> str:
    for name, value in context.invocation_metadata() or ():
        if name == "authorization":
            return str(value)
    return ""


def _code(http_status: int) -> grpc.StatusCode:
    if 200 <= http_status < 300:
        return grpc.StatusCode.OK
    return _STATUS.get(http_status, grpc.StatusCode.INTERNAL)


async def _no_body() -> bytes:
    return b""


async def _awaited(reply: Any) -> Any:
    return await reply
