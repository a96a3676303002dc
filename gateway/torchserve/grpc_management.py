"""TorchServe's gRPC management API (``org.pytorch.serve.grpc.management``), on its own port.

``ManagementAPIsService``'s six calls are the HTTP management API's routes
(:mod:`gateway.torchserve.management_routes`), each called with the request it stands for:
its fields as the query, the ``authorization`` metadata entry as the header. So both ways in
share every rule (settings, errors, the token). The answer is TorchServe's
``ManagementResponse``: ``msg`` is the describe or list JSON, or the status text of the
others; an error ends the call with the gRPC status TorchServe maps the HTTP one to.

As in TorchServe, a 0, an empty string or ``false`` is a field not given, and registering
or scaling over gRPC is asynchronous unless ``synchronous`` is set.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

import grpc
import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.state import STATE_KEY, GatewayState
from gateway.torchserve import management_routes as routes
from gateway.torchserve.grpc_messages import (
    Context,
    add_message,
    authorization,
    classes,
    file_proto,
    status_code,
)

PACKAGE = "org.pytorch.serve.grpc.management"
SERVICE = f"{PACKAGE}.ManagementAPIsService"
_NAMED = [("model_name", "string"), ("model_version", "string")]


def _file() -> Any:
    proto = file_proto(PACKAGE, "management")
    add_message(proto, "ManagementResponse", [("msg", "string")])
    add_message(proto, "DescribeModelRequest", [*_NAMED, ("customized", "bool")])
    add_message(proto, "ListModelsRequest", [("limit", "int32"), ("next_page_token", "int32")])
    register = [
        ("batch_size", "int32"), ("handler", "string"), ("initial_workers", "int32"),
        ("max_batch_delay", "int32"), ("model_name", "string"), ("response_timeout", "int32"),
        ("runtime", "string"), ("synchronous", "bool"), ("url", "string"),
        ("s3_sse_kms", "bool"), ("startup_timeout", "int32"),
    ]  # fmt: skip
    add_message(proto, "RegisterModelRequest", register)
    scale = [("max_worker", "int32"), ("min_worker", "int32"), ("number_gpu", "int32"),
             ("synchronous", "bool"), ("timeout", "int32")]  # fmt: skip
    add_message(proto, "ScaleWorkerRequest", [*_NAMED, *scale])
    add_message(proto, "SetDefaultRequest", _NAMED)
    add_message(proto, "UnregisterModelRequest", _NAMED)
    return proto


MESSAGES = classes(_file())
ManagementResponse = MESSAGES["ManagementResponse"]


class TorchServeManagement:
    """The service's calls, each answered by its HTTP route."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    async def describe(self, request: Any, context: Context) -> Any:
        version = request.model_version or None
        query = _given(request, "customized")
        return await self._call(
            context, "GET", query, lambda r: routes.describe(r, request.model_name, version)
        )

    async def list_models(self, request: Any, context: Context) -> Any:
        query = _given(request, "limit", "next_page_token")
        return await self._call(context, "GET", query, routes.list_models)

    async def register(self, request: Any, context: Context) -> Any:
        fields = ("url", "model_name", "batch_size", "max_batch_delay", "initial_workers",
                  "response_timeout", "startup_timeout", "handler", "runtime")  # fmt: skip
        query = {**_given(request, *fields), "synchronous": _bool(request.synchronous)}
        return await self._call(context, "POST", query, routes.register)

    async def scale(self, request: Any, context: Context) -> Any:
        query = {**_given(request, "min_worker", "max_worker")}
        query["synchronous"] = _bool(request.synchronous)
        version = request.model_version or None
        return await self._call(
            context, "PUT", query, lambda r: routes.scale(r, request.model_name, version)
        )

    async def set_default(self, request: Any, context: Context) -> Any:
        return await self._call(
            context,
            "PUT",
            {},
            lambda r: routes.set_default(r, request.model_name, request.model_version),
        )

    async def unregister(self, request: Any, context: Context) -> Any:
        version = request.model_version or None
        return await self._call(
            context, "DELETE", {}, lambda r: routes.unregister(r, request.model_name, version)
        )

    async def _call(
        self,
        context: Context,
        method: str,
        query: dict[str, str],
        route: Callable[[Request], Awaitable[Response]],
    ) -> Any:
        headers = [(b"authorization", authorization(context).encode("latin-1"))]
        scope = {
            "type": "http",
            "method": method,
            "path": "/models",
            "query_string": urlencode(query).encode(),
            "headers": headers,
            "state": {STATE_KEY: self.state},
        }
        response = await route(Request(scope))
        body = orjson.loads(bytes(response.body) or b"{}")
        if response.status_code >= 400:
            await context.abort(status_code(response.status_code), str(body.get("message", "")))
        is_status = isinstance(body, dict) and set(body) == {"status"}
        msg = body["status"] if is_status else bytes(response.body).decode()
        return ManagementResponse(msg=msg)


def handlers(state: GatewayState) -> grpc.GenericRpcHandler:
    """The service's method handlers, for a ``grpc.aio`` server."""
    service = TorchServeManagement(state)
    calls = {
        "DescribeModel": (service.describe, "DescribeModelRequest"),
        "ListModels": (service.list_models, "ListModelsRequest"),
        "RegisterModel": (service.register, "RegisterModelRequest"),
        "ScaleWorker": (service.scale, "ScaleWorkerRequest"),
        "SetDefault": (service.set_default, "SetDefaultRequest"),
        "UnregisterModel": (service.unregister, "UnregisterModelRequest"),
    }
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(
                call,
                request_deserializer=MESSAGES[message].FromString,
                response_serializer=ManagementResponse.SerializeToString,
            )
            for name, (call, message) in calls.items()
        },
    )


def _given(request: Any, *names: str) -> dict[str, str]:
    """The fields set (not 0, empty or false), as query parameters."""
    values = {name: getattr(request, name) for name in names}
    return {k: _bool(v) if isinstance(v, bool) else str(v) for k, v in values.items() if v}


def _bool(value: bool) -> str:
    return "true" if value else "false"
