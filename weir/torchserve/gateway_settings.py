"""The gateway's TorchServe settings (``WEIR_GATEWAY_TS_*``): its management port and limits.

:class:`~weir.settings.GatewaySettings` has them; they sit here as a group, each named
after the ``config.properties`` key it stands for.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

# TorchServe's allowed_urls default: any file or HTTP(S) URL.
DEFAULT_ALLOWED_URLS = "file://.*|http(s)?://.*"


class TorchServeGatewaySettings(BaseSettings):
    """TorchServe's management and inference API settings, for a gateway with a model store."""

    ts_management_port: int = Field(
        8081,
        ge=0,
        le=65535,
        description="TorchServe's management API (with a model store; 0: none)",
    )
    ts_management_host: str = Field(
        "127.0.0.1",
        description="the management API's bind address (TorchServe's default: loopback only)",
    )
    ts_max_request_size_bytes: int = Field(
        6553500, gt=0, description="largest /predictions body (TorchServe's max_request_size)"
    )
    ts_max_response_size_bytes: int = Field(
        6553500, gt=0, description="largest /predictions answer (TorchServe's max_response_size)"
    )
    ts_default_workers_per_model: int = Field(
        1,
        ge=0,
        description="instances per worker of an archive registered with no initial_workers "
        "(TorchServe's default_workers_per_model)",
    )
    ts_default_response_timeout_s: int = Field(
        120, gt=0, description="responseTimeout where none is set (default_response_timeout)"
    )
    ts_default_startup_timeout_s: int = Field(
        120, gt=0, description="startupTimeout where none is set (default_startup_timeout)"
    )
    ts_grpc_inference_port: int = Field(
        7070,
        ge=0,
        le=65535,
        description="TorchServe's gRPC inference API (with a model store; 0: none)",
    )
    ts_grpc_management_port: int = Field(
        7071,
        ge=0,
        le=65535,
        description="TorchServe's gRPC management API (with a model store; 0: none)",
    )
    ts_job_queue_size: int = Field(
        100, gt=0, description="requests an archive queues where none says (job_queue_size)"
    )
    ts_allowed_urls: str = Field(
        DEFAULT_ALLOWED_URLS,
        description="regular expressions, comma-separated, one of which an archive URL to "
        "download must match whole, in any case (TorchServe's allowed_urls)",
    )
    ts_max_download_bytes: int = Field(
        10 * 1024**3, gt=0, description="largest archive a registration downloads"
    )
    ts_download_timeout_s: float = Field(
        60.0, gt=0, description="longest wait for a download's next bytes"
    )
