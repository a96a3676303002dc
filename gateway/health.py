"""Which (model, version) pairs a live worker serves, from the workers' liveness registry.

Readiness as Triton reports it, shared by the HTTP routes and the gRPC service: the server
is ready when a live worker serves every model, a model when one serves it (a pipeline,
which runs nothing itself: when every one of its steps is served).
"""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.state import GatewayState
from weir import names
from weir.control.mode import ControlMode
from weir.errors import Unavailable
from weir.liveness import live_consumers
from weir.repository import ModelEntry
from weir.workload import served_instances


async def served_models(redis: Redis) -> set[tuple[str, str]]:
    """Every (model, version) that at least one live worker runs an instance of."""
    instances = served_instances(await live_consumers(redis, names.WORKER_GROUP))
    return {key for key, count in instances.items() if count > 0}


async def served_now(state: GatewayState, max_age_s: float | None = None) -> set[tuple[str, str]]:
    """:func:`served_models`, with an unreachable Redis as Unavailable (503).

    Shared by the probes that ask at about the same time (see gateway.readiness_cache), from
    a read at most ``max_age_s`` old (``ready_cache_s`` by default): read the set, never
    change it.
    """
    age_s = state.settings.ready_cache_s if max_age_s is None else max_age_s
    read = state.readiness.get(lambda: served_models(state.redis), age_s, state.catalog.generation)
    try:
        return await read
    except RedisError as exc:
        raise Unavailable(f"Redis is unreachable: {exc}") from None


async def ready_when(state: GatewayState, check: Callable[[set[tuple[str, str]]], bool]) -> bool:
    """Whether ``check`` passes on what the live workers serve.

    A recent shared read may say yes; a no is read again (sharing only a read in flight),
    so a stale answer never keeps a server that just became ready out of its balancer (or
    one gateway process saying 503 while another says 200). A gateway whose reply reader
    is failing is ready for nothing: no answer could reach it.
    """
    if state.mesh.reader_failure is not None:
        return False
    if check(await served_now(state)):
        return True
    return check(await served_now(state, max_age_s=0.0))


def serves_all(state: GatewayState, served: set[tuple[str, str]]) -> bool:
    """Whether the server is ready: it serves what it must.

    Mode none: a live worker serves every version of every model. A model control mode:
    every model the mesh started with, or has served since, can answer a request that names
    no version. So a model loading, a new version warming up or a failed load never takes a ready
    gateway out of its load balancer, while a mesh that starts is ready once its models are.
    (A pipeline runs no instances of its own; its steps are the models that must be served.)
    """
    catalog = state.catalog
    models = [e for e in catalog if not e.config.is_ensemble]
    if state.settings.model_control_mode is ControlMode.NONE:
        return {(e.name, v) for e in models for v in e.versions} <= served
    counted = catalog.counted or set()
    return all(catalog.answerable(e, served) for e in models if e.name in counted)


def serves_model(
    state: GatewayState, entry: ModelEntry, version: str, served: set[tuple[str, str]]
) -> bool:
    needed = {(entry.name, version)}
    if entry.config.is_ensemble:
        steps = state.mesh.router.pipelines[entry.name].steps
        needed = {(step.model, step.version) for step in steps}
    return needed <= served
