"""Triton's shared-memory routes: system regions registered, listed and unregistered.

They take the management token (when one is set): registering makes the gateway map a
host memory object, an operator's act. Inference that names a registered region takes the
inference token as any other. CUDA shared memory answers 503 until the GPU pool takes it.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request, Response

from gateway.auth import management_scope
from gateway.state import gateway_state
from weir.errors import InvalidInput, Unavailable

router = APIRouter()
MANAGEMENT = [Depends(management_scope)]
# A register request is a small JSON object; anything longer is refused unread.
REGISTER_LIMIT_BYTES = 64 * 1024
CUDA_UNAVAILABLE = (
    "Weir does not support CUDA shared memory yet (the GPU pool cannot read it); use system "
    "shared memory or send tensor data in the request"
)


@router.get("/v2/systemsharedmemory/status", dependencies=MANAGEMENT)
@router.get("/v2/systemsharedmemory/region/{name}/status", dependencies=MANAGEMENT)
async def system_status(request: Request) -> Response:
    regions = gateway_state(request).shared_memory.status(request.path_params.get("name"))
    return Response(orjson.dumps(regions), media_type="application/json")


@router.post("/v2/systemsharedmemory/region/{name}/register", dependencies=MANAGEMENT)
async def system_register(request: Request, name: str) -> Response:
    key, offset, byte_size = _register_request(await _small_body(request))
    gateway_state(request).shared_memory.register(name, key, offset, byte_size)
    return Response(status_code=200)


@router.post("/v2/systemsharedmemory/unregister", dependencies=MANAGEMENT)
@router.post("/v2/systemsharedmemory/region/{name}/unregister", dependencies=MANAGEMENT)
async def system_unregister(request: Request) -> Response:
    gateway_state(request).shared_memory.unregister(request.path_params.get("name"))
    return Response(status_code=200)


@router.get("/v2/cudasharedmemory/status", dependencies=MANAGEMENT)
@router.get("/v2/cudasharedmemory/region/{name}/status", dependencies=MANAGEMENT)
@router.post("/v2/cudasharedmemory/region/{name}/register", dependencies=MANAGEMENT)
@router.post("/v2/cudasharedmemory/unregister", dependencies=MANAGEMENT)
@router.post("/v2/cudasharedmemory/region/{name}/unregister", dependencies=MANAGEMENT)
async def cuda_shared_memory() -> Response:
    raise Unavailable(CUDA_UNAVAILABLE)


async def _small_body(request: Request) -> bytes:
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > REGISTER_LIMIT_BYTES:
            raise InvalidInput(f"a register request is at most {REGISTER_LIMIT_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _register_request(raw: bytes) -> tuple[str, int, int]:
    """Triton's ``{key, offset, byte_size}``; ``offset`` defaults to 0."""
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidInput("a register request must be a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidInput("a register request must be a JSON object")
    key = body.get("key")
    if key is None:
        raise InvalidInput("Shared memory register request has no 'key' field")
    if not isinstance(key, str):
        raise InvalidInput("Shared memory register request's 'key' must be a string")
    if "byte_size" not in body:
        raise InvalidInput("Shared memory register request has no 'byte_size' field")
    return key, _count(body, "offset"), _count(body, "byte_size")


def _count(body: dict[str, Any], field: str) -> int:
    value = body.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"Shared memory register request's '{field}' must be a whole number")
    return value
