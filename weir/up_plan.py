"""What ``weir up`` runs, settled before its supervisor starts.

``weir up`` reads and checks its settings (pydantic, TorchServe's config, the model store)
and writes the outcome here; then it replaces itself (``exec``) with the supervisor,
``python -m weir.embedded``, which reads the plan back and imports the standard library
and little else. The supervisor lives as long as the mesh: without pydantic and its settings
classes it holds about 15 MiB less, on a machine where the whole mesh is counted against a
single-process server's memory. The process keeps its pid, so a signal sent to ``weir up``
reaches the supervisor.

This module must stay free of pydantic: the supervisor imports it.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from weir.up_settings import UpSettings

# The environment variable that carries the plan across the exec; the supervisor removes it.
PLAN_ENV = "WEIR_UP_PLAN"
SUPERVISOR_MODULE = "weir.embedded"


@dataclass(frozen=True)
class UpPlan:
    """The supervisor's whole input: its own numbers and each child's environment."""

    shutdown_grace_s: float
    redis_port: int
    redis_server: str
    redis_maxmemory: str
    http_port: int
    grpc_port: int
    metrics_port: int
    cpu_workers: int
    batchers: int
    repository: str
    log_level: str
    model_store: str | None = None
    ts_management_port: int = 0
    ts_grpc_inference_port: int = 0
    ts_grpc_management_port: int = 0
    # WEIR_* for every child, beside the private Redis's URL (known once it runs).
    child_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, settings: UpSettings) -> UpPlan:
        repository = str(settings.repository.resolve())
        env = {
            "WEIR_REPOSITORY": repository,
            "WEIR_LOG_LEVEL": settings.log_level,
            "WEIR_DEFAULT_MAX_BATCH_SIZE": str(settings.default_max_batch_size),
            "WEIR_GATEWAY_HTTP_PORT": str(settings.http_port),
            "WEIR_GATEWAY_GRPC_PORT": str(settings.grpc_port),
            "WEIR_GATEWAY_METRICS_PORT": str(settings.metrics_port),
            "WEIR_GATEWAY_PROCESSES": str(settings.gateway_processes),
            "WEIR_GATEWAY_RESPONSE_CACHE_BYTES": str(settings.response_cache_bytes),
            "WEIR_GATEWAY_RESPONSE_CACHE_REDIS_URL": settings.response_cache_redis_url,
            "WEIR_GATEWAY_RESPONSE_CACHE_TIMEOUT_S": str(settings.response_cache_timeout_s),
            "WEIR_GATEWAY_TRACE_FILE": settings.trace_file,
            "WEIR_GATEWAY_TRACE_LEVEL": settings.trace_level,
            "WEIR_GATEWAY_TRACE_RATE": str(settings.trace_rate),
            "WEIR_GATEWAY_TRACE_COUNT": str(settings.trace_count),
            "WEIR_GATEWAY_TRACE_LOG_FREQUENCY": str(settings.trace_log_frequency),
            "WEIR_MODEL_CONTROL_MODE": settings.model_control_mode.value,
            "WEIR_LOAD_MODEL": settings.load_model,
            "WEIR_REPOSITORY_POLL_SECS": str(settings.repository_poll_secs),
        }
        store = None if settings.model_store is None else str(settings.model_store.resolve())
        if store is not None:
            env.update(
                WEIR_MODEL_STORE=store,
                WEIR_GATEWAY_TS_MANAGEMENT_PORT=str(settings.ts_management_port),
                WEIR_GATEWAY_TS_MANAGEMENT_HOST=settings.ts_management_host,
                WEIR_GATEWAY_TS_MAX_REQUEST_SIZE_BYTES=str(settings.ts_max_request_size_bytes),
                WEIR_GATEWAY_TS_MAX_RESPONSE_SIZE_BYTES=str(settings.ts_max_response_size_bytes),
                WEIR_GATEWAY_TS_DEFAULT_WORKERS_PER_MODEL=str(
                    settings.ts_default_workers_per_model
                ),
                WEIR_GATEWAY_TS_DEFAULT_RESPONSE_TIMEOUT_S=str(
                    settings.ts_default_response_timeout_s
                ),
                WEIR_GATEWAY_TS_DEFAULT_STARTUP_TIMEOUT_S=str(
                    settings.ts_default_startup_timeout_s
                ),
                WEIR_GATEWAY_TS_JOB_QUEUE_SIZE=str(settings.ts_job_queue_size),
                WEIR_GATEWAY_TS_GRPC_INFERENCE_PORT=str(settings.ts_grpc_inference_port),
                WEIR_GATEWAY_TS_GRPC_MANAGEMENT_PORT=str(settings.ts_grpc_management_port),
                WEIR_GATEWAY_TS_ALLOWED_URLS=settings.ts_allowed_urls,
                WEIR_GATEWAY_TS_MAX_DOWNLOAD_BYTES=str(settings.ts_max_download_bytes),
                WEIR_GATEWAY_TS_DOWNLOAD_TIMEOUT_S=str(settings.ts_download_timeout_s),
                WEIR_WORKER_TS_INSTALL_REQUIREMENTS=str(settings.ts_install_requirements),
                WEIR_WORKER_TS_DECODE_INPUT_REQUEST=str(settings.ts_decode_input_request),
            )
        return cls(
            shutdown_grace_s=settings.shutdown_grace_s,
            redis_port=settings.redis_port,
            redis_server=settings.redis_server,
            redis_maxmemory=settings.redis_maxmemory,
            http_port=settings.http_port,
            grpc_port=settings.grpc_port,
            metrics_port=settings.metrics_port,
            cpu_workers=settings.cpu_workers,
            batchers=settings.batchers,
            repository=repository,
            log_level=settings.log_level,
            model_store=store,
            ts_management_port=settings.ts_management_port,
            ts_grpc_inference_port=settings.ts_grpc_inference_port,
            ts_grpc_management_port=settings.ts_grpc_management_port,
            child_env=env,
        )

    def encode(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def decode(cls, text: str) -> UpPlan:
        return cls(**json.loads(text))


def exec_supervisor(plan: UpPlan) -> None:
    """Replace this process with the supervisor running ``plan``; does not return."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[PLAN_ENV] = plan.encode()
    os.execv(sys.executable, [sys.executable, "-m", SUPERVISOR_MODULE])
