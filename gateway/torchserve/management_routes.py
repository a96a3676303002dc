"""TorchServe's management API: register, scale, describe, set the default, unregister.

Served on the management port (:mod:`gateway.torchserve.ports`) behind the management
token. Archives come from the model store (:class:`~weir.torchserve.store.ModelStore`),
which writes them into the repository as models of the ``torchserve`` backend; loading,
scaling and unloading then go through Weir's model control (mode explicit), so a model
registered here batches in the batcher and runs on the worker pool like any other.
TorchServe's ``batch_size`` and ``max_batch_delay`` become the model's dynamic batching,
its workers the instance count per worker process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from gateway import model_control
from gateway.auth import Scope, check_token
from gateway.inference import read_body
from gateway.state import GatewayState, gateway_state
from gateway.torchserve.ports import PREFIX
from gateway.torchserve.responses import JSON, error_response, status_response, weir_error_response
from gateway.torchserve.store_view import describe_versions
from weir.errors import InvalidInput, ServerError, Unavailable, WeirError
from weir.torchserve.store import ModelStore, Registration, StoreError

# Served on the management port only (gateway.torchserve.ports), so not in the HTTP port's
# OpenAPI description.
router = APIRouter(prefix=PREFIX, include_in_schema=False)
NO_WORKERS = (
    "registered with 0 initial workers. Use scale workers API to add workers for the model."
)
PROCESSING = "Processing worker updates..."


@router.get("/models")
async def list_models(request: Request) -> Response:
    async def answer(state: GatewayState, store: ModelStore) -> Response:
        limit = _int(request, "limit", 100)
        token = _int(request, "next_page_token", 0)
        names = await asyncio.to_thread(store.models)
        page = names[token : token + limit]
        body: dict[str, Any] = {
            "models": [{"modelName": n, "modelUrl": store.describe(n).default_url} for n in page]
        }
        if token + limit < len(names):
            body["nextPageToken"] = str(token + limit)
        return _json(body)

    return await _guarded(request, answer)


@router.post("/models")
async def register(request: Request) -> Response:
    async def answer(state: GatewayState, store: ModelStore) -> Response:
        query = await _register_query(request, state.settings.body_limit_bytes)
        if not query.get("url"):
            raise InvalidInput("Parameter url is required.")
        _check_unsupported(query)
        workers = _opt_int(query, "initial_workers")
        registration = await asyncio.to_thread(
            store.register,
            str(query["url"]),
            model_name=query.get("model_name") or None,
            batch_size=_opt_int(query, "batch_size"),
            max_batch_delay_ms=_opt_int(query, "max_batch_delay"),
            workers=workers or None,
            response_timeout_s=_opt_int(query, "response_timeout"),
            startup_timeout_s=_opt_int(query, "startup_timeout"),
            default_workers=state.settings.ts_default_workers_per_model or None,
            default_response_timeout_s=state.settings.ts_default_response_timeout_s,
            default_startup_timeout_s=state.settings.ts_default_startup_timeout_s,
            default_job_queue_size=state.settings.ts_job_queue_size,
        )
        registered = f'Model "{registration.name}" Version: {registration.ts_version}'
        if workers == 0 or (workers is None and not state.settings.ts_default_workers_per_model):
            return status_response(f"{registered} {NO_WORKERS}")
        if not _flag(query.get("synchronous"), True):
            state.torchserve.spawn(_serve_new(state, store, registration), f"load {registered}")
            return status_response(PROCESSING, 202)
        await _serve_new(state, store, registration)
        return status_response(
            f"{registered} registered with {registration.workers} initial workers"
        )

    return await _guarded(request, answer)


@router.get("/models/{model}")
@router.get("/models/{model}/{version}")
async def describe(request: Request, model: str, version: str | None = None) -> Response:
    async def answer(state: GatewayState, store: ModelStore) -> Response:
        customized = _flag(request.query_params.get("customized"), False)
        return _json(await describe_versions(state, store, model, version, customized))

    return await _guarded(request, answer)


@router.put("/models/{model}")
@router.put("/models/{model}/{version}")
async def scale(request: Request, model: str, version: str | None = None) -> Response:
    async def answer(state: GatewayState, store: ModelStore) -> Response:
        minimum = _int(request, "min_worker", 1)
        if _int(request, "max_worker", minimum) < minimum:
            raise InvalidInput("max_worker cannot be less than min_worker.")
        store.version_for(model, version or request.query_params.get("model_version"))
        work = _scale(state, store, model, minimum)
        if not _flag(request.query_params.get("synchronous"), False):
            state.torchserve.spawn(work, f"scale {model} to {minimum}")
            return status_response(PROCESSING, 202)
        await work
        named = f", version: {version}" if version else ""
        return status_response(f"Workers scaled to {minimum} for model: {model}{named}")

    return await _guarded(request, answer)


@router.put("/models/{model}/{version}/set-default")
async def set_default(request: Request, model: str, version: str) -> Response:
    async def answer(state: GatewayState, store: ModelStore) -> Response:
        weir_version = await asyncio.to_thread(store.set_default, model, version)
        await _route_default(state, store, model, weir_version)
        return status_response(
            f'Default version successfully updated for model "{model}" to "{version}"'
        )

    return await _guarded(request, answer)


@router.delete("/models/{model}")
@router.delete("/models/{model}/{version}")
async def unregister(request: Request, model: str, version: str | None = None) -> Response:
    async def answer(state: GatewayState, store: ModelStore) -> Response:
        record = store.describe(model)
        store.version_for(model, version)  # an unknown version is a 404 before anything
        if len(record.versions) == 1:
            await _unload(state, model)
            await asyncio.to_thread(store.unregister, model, version)
        else:
            await asyncio.to_thread(store.unregister, model, version)
            await _reload(state, store, model)
        return status_response(f'Model "{model}" unregistered')

    return await _guarded(request, answer)


async def _guarded(request: Request, answer: Any) -> Response:
    state = gateway_state(request)
    store = state.torchserve.store
    try:
        check_token(request, Scope.MANAGEMENT)
        if store is None:
            raise Unavailable("no model store is set (weir up --model-store DIR)")
        response: Response = await answer(state, store)
        return response
    except StoreError as exc:
        return error_response(exc.http_status, str(exc))
    except WeirError as exc:
        return weir_error_response(exc)


async def _serve_new(state: GatewayState, store: ModelStore, registration: Registration) -> None:
    """Load a newly registered version; a failure unregisters it, as TorchServe does."""
    try:
        await _reload(state, store, registration.name)
    except WeirError as exc:
        await asyncio.to_thread(store.unregister, registration.name, registration.ts_version)
        if registration.name not in store.models():
            await _unload(state, registration.name)  # a load that timed out may still be asked
        raise ServerError(exc.message) from None


async def _reload(state: GatewayState, store: ModelStore, model: str) -> None:
    await model_control.load(state, model, {})
    await _route_default(state, store, model, store.version_for(model, None))


async def _route_default(
    state: GatewayState, store: ModelStore, model: str, weir_version: str
) -> None:
    # KServe v2 requests that name no version go to TorchServe's default version too.
    if len(store.describe(model).versions) > 1:
        await model_control.set_weights(state, model, {weir_version: 1})


async def _scale(state: GatewayState, store: ModelStore, model: str, workers: int) -> None:
    if workers == 0:
        await _unload(state, model)
        return
    await asyncio.to_thread(store.scale, model, workers)
    await _reload(state, store, model)


async def _unload(state: GatewayState, model: str) -> None:
    if model in state.catalog.models:
        await model_control.unload(state, model, {})


def _check_unsupported(query: dict[str, Any]) -> None:
    """Refuse what would otherwise be ignored: another handler, a runtime not Python's."""
    if query.get("handler"):
        raise InvalidInput(
            "Parameter handler is not supported: the archive's own handler serves it; "
            "build the archive with torch-model-archiver --handler instead"
        )
    runtime = str(query.get("runtime") or "python")
    if runtime.lower() not in ("python", "python3"):
        raise InvalidInput(f"Parameter runtime {runtime!r} is not supported: only python")


async def _register_query(request: Request, limit_bytes: int) -> dict[str, Any]:
    """The registration's parameters: the query string, or a JSON body as TorchServe takes."""
    query: dict[str, Any] = dict(request.query_params)
    if request.headers.get("content-type", "").split(";")[0].strip() == JSON:
        try:
            body = orjson.loads(await read_body(request, limit_bytes) or b"{}")
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(f"malformed JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise InvalidInput("the JSON body must be an object")
        query.update({str(k): v for k, v in body.items()})
    return query


def _int(request: Request, name: str, default: int) -> int:
    value = _opt_int(dict(request.query_params), name)
    return default if value is None else value


def _opt_int(query: dict[str, Any], name: str) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidInput(f"Parameter {name} must be an integer, got {str(raw)[:40]!r}") from None
    return value


def _flag(raw: Any, default: bool) -> bool:
    if raw is None:
        return default
    return raw is True or str(raw).lower() == "true"


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), media_type=JSON)
