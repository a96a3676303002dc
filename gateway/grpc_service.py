"""KServe v2 over gRPC: Triton's ``GRPCInferenceService``, so ``tritonclient.grpc`` works.

The servicer answers from the same :class:`~gateway.state.GatewayState` as the HTTP routes
and through the same code: readiness from :mod:`gateway.health`, metadata, config and
statistics from :mod:`gateway.metadata`, the repository extension from
:mod:`gateway.model_control`, inference through
:func:`gateway.inference.execute` (validation, admission, deadline) with the same metrics.
A :class:`~weir.errors.WeirError` becomes the gRPC status Triton would send, with the
message HTTP would give. The same bearer tokens guard the same calls, read from the
``authorization`` metadata entry. System shared memory is answered from the process's
registry (:mod:`gateway.shared_memory`); CUDA shared memory answers UNAVAILABLE. Calls Weir
does not implement (trace and log settings) answer UNIMPLEMENTED, naming what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from gateway import (
    grpc_codec,
    grpc_parts,
    grpc_wire,
    health,
    metadata,
    model_control,
    shared_memory,
    trace_routes,
)
from gateway.auth import Scope, check_authorization, required_token
from gateway.codec import InferBody
from gateway.grpc_stream import INTERNAL_MESSAGE, StreamAnswers
from gateway.inference import execute
from gateway.parts import refuse_decoupled
from gateway.shared_memory import RegionExists
from gateway.shared_memory_routes import CUDA_UNAVAILABLE
from gateway.state import GatewayState
from gateway.validation import precheck_input
from weir.config import ModelConfig as Config  # the servicer has a method ModelConfig
from weir.errors import ErrorKind, NotFound, ServerError, Unavailable, WeirError

logger = logging.getLogger(__name__)

# Triton's mapping of its error codes to gRPC's (a queue full is UNAVAILABLE).
GRPC_STATUS: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.CANCELED: grpc.StatusCode.CANCELLED,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}
# How long past a client's gRPC deadline the mesh keeps its request: enough that the client's
# own DEADLINE_EXCEEDED always comes first, even across hosts whose clocks differ a little.
CLIENT_DEADLINE_GRACE_S = 1.0

Handler = Callable[[Any, Any, Any], Awaitable[Any]]


def grpc_status(error: WeirError) -> grpc.StatusCode:
    if isinstance(error, RegionExists):  # HTTP's 400, as Triton; its own code over gRPC
        return grpc.StatusCode.ALREADY_EXISTS
    return GRPC_STATUS.get(error.kind, grpc.StatusCode.INTERNAL)


def _answers_errors(method: Handler) -> Handler:
    """Turn a WeirError (or any failure) into the call's status and message."""

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except WeirError as exc:
            error = exc
        except Exception:
            logger.exception("gRPC %s failed", method.__name__)
            error = ServerError(INTERNAL_MESSAGE)
        # HTTP's headers (Retry-After, WWW-Authenticate) travel as trailing metadata.
        trailing = tuple((key.lower(), value) for key, value in error.headers.items())
        await context.abort(grpc_status(error), error.message, trailing)

    return handler


async def _cuda_unavailable(self: Any, request: Any, context: Any) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE, CUDA_UNAVAILABLE)


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Triton's inference service, answered from the gateway's state."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    @_answers_errors
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    @_answers_errors
    async def ServerReady(self, request: Any, context: Any) -> Any:
        state = self.state
        ready = await health.ready_when(state, functools.partial(health.serves_all, state))
        return service_pb2.ServerReadyResponse(ready=ready)

    @_answers_errors
    async def ModelReady(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.INFERENCE)
        try:
            entry, version = self.state.repository.resolve(request.name, request.version)
        except NotFound:
            # As Triton: a model it does not know is not ready, rather than an error.
            return service_pb2.ModelReadyResponse(ready=False)
        serves = functools.partial(health.serves_model, self.state, entry, version)
        return service_pb2.ModelReadyResponse(ready=await health.ready_when(self.state, serves))

    @_answers_errors
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(
            metadata.server_metadata(), service_pb2.ServerMetadataResponse()
        )

    @_answers_errors
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.INFERENCE)
        entry, _ = self.state.repository.resolve(request.name, request.version)
        found = metadata.model_metadata(entry, request.version or None)
        return json_format.ParseDict(found, service_pb2.ModelMetadataResponse())

    @_answers_errors
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.INFERENCE)
        entry, _ = self.state.repository.resolve(request.name, request.version)
        # Weir's config holds model_config.proto's fields; the one extra, an output's
        # `optional` (always false), has no place in the message.
        config = json_format.ParseDict(
            metadata.model_config(entry), model_config_pb2.ModelConfig(), True
        )
        return service_pb2.ModelConfigResponse(config=config)

    @_answers_errors
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        repository = self.state.repository
        if request.name:
            entry = repository.resolve(request.name, request.version or None)[0]
            entries = [(entry, request.version or None)]
        else:  # As Triton: no name, every version of every model
            entries = [(entry, None) for entry in repository]
        response = service_pb2.ModelStatisticsResponse()
        for stats in await metadata.read_statistics(self.state.redis, entries):
            json_format.ParseDict(stats, response.model_stats.add())
        return response

    @_answers_errors
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        response = service_pb2.RepositoryIndexResponse()
        for model in await model_control.index(self.state, request.ready):
            response.models.add(**model)
        return response

    @_answers_errors
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        await model_control.load(self.state, request.model_name, _parameters(request))
        return service_pb2.RepositoryModelLoadResponse()

    @_answers_errors
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        await model_control.unload(self.state, request.model_name, _parameters(request))
        return service_pb2.RepositoryModelUnloadResponse()

    @_answers_errors
    async def ModelInfer(self, request: bytes, context: Any) -> Any:
        self._authorize(context, Scope.INFERENCE)
        message = await self.decode(request)
        return await self.infer(message, context.time_remaining())

    @_answers_errors
    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> None:
        self._authorize(context, Scope.INFERENCE)
        stream = StreamAnswers(self, context)
        try:
            async for request in request_iterator:
                await stream.submit(request)
            await stream.finish()
        finally:
            stream.cancel()

    async def decode(self, wire: bytes) -> Any:
        """The ``ModelInferRequest`` an infer call sent undecoded (see gateway.grpc_server).

        A large one is bounded by its model before protobuf builds it (gateway.grpc_wire); a
        refusal counts as the model's failure, as one found while parsing does.
        """
        try:
            return await grpc_wire.decode_request(self.state.settings, wire, self._model_config)
        except WeirError as exc:
            name, version, _ = grpc_wire.head(wire)
            with contextlib.suppress(WeirError):
                entry, version = self.state.repository.resolve(name, version)
                self.state.metrics.failed(entry.name, version, exc.kind)
            raise

    def _model_config(self, name: str) -> Config | None:
        # Called in a parse thread: one read of the catalog's dict, which stays consistent.
        entry = self.state.repository.models.get(name)
        return None if entry is None else entry.config

    async def infer(
        self, request: Any, remaining_s: float | None, send: Callable[[Any], None] | None = None
    ) -> Any:
        """One ``ModelInferRequest``, answered as HTTP answers it; WeirError on failure.

        ``send`` takes each response of a decoupled model before the last (gateway.grpc_parts);
        without it, a decoupled model is refused. None: nothing more to send (a decoupled
        model's request ended with no last response, whose client asked for no empty one).
        """
        state = self.state
        started_s = time.monotonic()
        entry, version = state.repository.resolve(request.model_name, request.model_version)
        if send is None:
            refuse_decoupled(entry, grpc_parts.UNARY)
        precheck = functools.partial(precheck_input, entry.config)
        try:
            body = await grpc_codec.parse_off_loop(
                state.settings, request, precheck, state.shared_memory
            )
            _client_deadline(body, remaining_s)
            parts = None
            if send is not None and entry.config.decoupled:
                parts = grpc_parts.part_listener(entry, version, request.id, body, send)
            reply = await execute(state, entry, version, body, parts)
            shared = shared_memory.write_outputs(body.shared_outputs, reply.outputs)
        except WeirError as exc:
            state.metrics.failed(entry.name, version, exc.kind)
            raise
        except asyncio.CancelledError:
            # The call ended before its answer: its deadline passed, or the client cancelled
            # it (the mesh was told, see gateway.mesh); Triton's reasons tell them apart.
            state.metrics.failed(entry.name, version, _ended_by(started_s, remaining_s))
            raise
        state.metrics.answered(entry.name, version, reply)
        if parts is not None:
            return grpc_parts.last_response(entry, version, request.id, body, reply)
        outputs = grpc_codec.select_outputs(body, reply.outputs)
        return grpc_codec.render_infer_response(entry.name, version, request.id, outputs, shared)

    @_answers_errors
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for region in self.state.shared_memory.status(request.name or None):
            response.regions[region["name"]].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    @_answers_errors
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        self.state.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return service_pb2.SystemSharedMemoryRegisterResponse()

    @_answers_errors
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        self.state.shared_memory.unregister(request.name or None)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    def _authorize(self, context: Any, scope: Scope) -> None:
        token = required_token(self.state.settings, scope)
        if token is not None:
            check_authorization(_metadata(context, "authorization"), token, scope)

    CudaSharedMemoryStatus = _cuda_unavailable
    CudaSharedMemoryRegister = _cuda_unavailable
    CudaSharedMemoryUnregister = _cuda_unavailable

    @_answers_errors
    async def LogSettings(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        log = self.state.log
        if log is None:
            raise Unavailable("the server does not support dynamic logging")
        change = {name: _setting(value) for name, value in request.settings.items()}
        settings = await log.update(change) if change else await log.read()
        response = service_pb2.LogSettingsResponse()
        for name, value in settings.as_json().items():
            kind = "bool_param" if isinstance(value, bool) else "string_param"
            if isinstance(value, int) and not isinstance(value, bool):
                kind = "uint32_param"
            setattr(response.settings[name], kind, value)
        return response

    @_answers_errors
    async def TraceSetting(self, request: Any, context: Any) -> Any:
        self._authorize(context, Scope.MANAGEMENT)
        model = request.model_name or None
        values = {
            name: None if not value.value else list(value.value)
            for name, value in request.settings.items()
        }
        if values:  # none: a read (tritonclient's get_trace_settings)
            settings = await trace_routes.change(self.state, model, values)
        else:
            settings = await trace_routes.settings_of(self.state, model)
        response = service_pb2.TraceSettingResponse()
        for name, value in settings.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response


def _setting(value: Any) -> Any:
    """A ``LogSettingsRequest.SettingValue`` as a plain value (None when unset)."""
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def _parameters(request: Any) -> dict[str, Any]:
    """A repository call's ``ModelRepositoryParameter`` map as plain values."""
    parameters: dict[str, Any] = {}
    for key, parameter in request.parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        parameters[key] = getattr(parameter, kind) if kind else None
    return parameters


def _metadata(context: Any, key: str) -> str:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return str(value)
    return ""


def _ended_by(started_s: float, remaining_s: float | None) -> ErrorKind:
    """Why a call ended early: its gRPC deadline passed, or its client cancelled it."""
    if remaining_s is not None and time.monotonic() >= started_s + remaining_s:
        return ErrorKind.TIMEOUT
    return ErrorKind.CANCELED


def _client_deadline(body: InferBody, remaining_s: float | None) -> None:
    """Let the mesh give up on a request a grace after the client's gRPC deadline.

    As Triton, the client's deadline is the client's: when it passes, gRPC ends the call with
    its own DEADLINE_EXCEEDED, which clients match on. So the request's deadline is lowered
    only to a grace past it, never below, and the mesh still drops what nobody awaits; an
    invalid ``timeout`` is left for the mesh to refuse.
    """
    if remaining_s is None:
        return
    limit_us = int((remaining_s + CLIENT_DEADLINE_GRACE_S) * 1e6)
    given = body.parameters.get("timeout")
    valid = isinstance(given, int) and not isinstance(given, bool) and given > 0
    if given is None or (valid and given > limit_us):
        body.parameters["timeout"] = limit_us
