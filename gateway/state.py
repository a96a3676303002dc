"""What the gateway holds for its lifetime, built in the lifespan and read by the routes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from starlette.requests import Request

from gateway.catalog import Catalog
from gateway.mesh import MeshClient
from gateway.metrics import RequestMetrics
from gateway.readiness_cache import ReadinessCache
from gateway.response_cache import AnswerCache, CacheCounts
from gateway.shared_memory import SharedMemoryRegistry
from gateway.torchserve.front import TorchServeFront
from gateway.tracing import Tracer
from weir.log_settings import LogControl
from weir.settings import GatewaySettings

if TYPE_CHECKING:
    from gateway.control import ControlLoop


@dataclass(frozen=True, slots=True)
class GatewayState:
    """The gateway's resources; routes reach them through :func:`gateway_state`."""

    settings: GatewaySettings
    catalog: Catalog
    redis: Redis
    mesh: MeshClient
    metrics: RequestMetrics
    shared_memory: SharedMemoryRegistry
    control: ControlLoop
    torchserve: TorchServeFront = field(default_factory=lambda: TorchServeFront(None))
    readiness: ReadinessCache = field(default_factory=ReadinessCache)
    cache: AnswerCache | None = None  # Triton's response cache, when one is configured
    cache_counts: CacheCounts | None = None
    log: LogControl | None = None  # Triton's logging extension
    tracer: Tracer | None = None  # Triton's trace extension

    @property
    def repository(self) -> Catalog:
        """The models served now (they change with the desired state in a control mode)."""
        return self.catalog


STATE_KEY = "weir"


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = getattr(request.state, STATE_KEY)
    return state
