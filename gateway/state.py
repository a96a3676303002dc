"""What the gateway holds for its lifetime, built in the lifespan and read by the routes."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from starlette.requests import Request

from gateway.mesh import MeshClient
from gateway.metrics import RequestMetrics
from gateway.shared_memory import SharedMemoryRegistry
from weir.repository import Repository
from weir.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class GatewayState:
    """The gateway's resources; routes reach them through :func:`gateway_state`."""

    settings: GatewaySettings
    repository: Repository
    redis: Redis
    mesh: MeshClient
    metrics: RequestMetrics
    shared_memory: SharedMemoryRegistry


STATE_KEY = "weir"


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = getattr(request.state, STATE_KEY)
    return state
