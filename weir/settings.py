"""One typed settings object per service, built once at the entrypoint and passed down.

Order: command-line options over environment variables over defaults. Shared settings use
the ``WEIR_`` prefix (``WEIR_REDIS_URL``, ``WEIR_REPOSITORY``); each service's own use
``WEIR_GATEWAY_``, ``WEIR_BATCHER_`` or ``WEIR_WORKER_``. Nothing below the entrypoint
reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from weir.cache_settings import CacheGatewaySettings
from weir.completion import DEFAULT_PYTHON_TIMEOUT_S, Completion
from weir.control.mode import ControlMode
from weir.redis_io import redis_target
from weir.torchserve.gateway_settings import TorchServeGatewaySettings
from weir.trace_settings import TraceGatewaySettings


def _shared(name: str, default: Any, **kwargs: Any) -> Any:
    # Shared settings keep one env name across services, whatever the service's prefix.
    return Field(default, validation_alias=AliasChoices(name, f"WEIR_{name.upper()}"), **kwargs)


class ServiceSettings(BaseSettings):
    """Settings every service has."""

    # Inputs stay out of error messages: a URL or a token may carry a secret.
    model_config = SettingsConfigDict(
        populate_by_name=True, extra="ignore", frozen=True, hide_input_in_errors=True
    )

    redis_url: str = _shared("redis_url", "redis://127.0.0.1:6379/0")
    repository: Path = _shared("repository", Path("examples/models"))
    log_level: str = _shared("log_level", "INFO")
    shutdown_grace_s: float = _shared("shutdown_grace_s", 10.0, gt=0)
    redis_retries: int = Field(5, ge=0, description="retries, with exponential backoff")
    redis_timeout_s: float = _shared(
        "redis_timeout_s",
        10.0,
        gt=0,
        description="longest wait for a hot-path Redis reply (beyond a read's own block time) "
        "before its connection is dropped and made again",
    )
    heartbeat_ttl_s: float = _shared("heartbeat_ttl_s", 3.0, gt=0)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str) -> str:
        redis_target.parse(url)  # a Sentinel URL's mistakes, said at start
        return url

    model_control_mode: ControlMode = _shared(
        "model_control_mode",
        ControlMode.NONE,
        description="none: the repository is read once at start; explicit: only what "
        "--load-model and the load API name; poll: the repository's files, every "
        "repository_poll_secs (Triton's --model-control-mode)",
    )
    load_model: str = _shared(
        "load_model",
        "",
        description="models loaded at start in mode explicit, comma-separated; * for all",
    )
    repository_poll_secs: float = _shared("repository_poll_secs", 15.0, gt=0)
    control_refresh_s: float = _shared(
        "control_refresh_s",
        0.5,
        gt=0,
        description="how often a service looks for a change of what the mesh serves",
    )
    log_settings_refresh_s: float = _shared(
        "log_settings_refresh_s",
        2.0,
        gt=0,
        description="how often a service reads the mesh's log settings (Triton's logging "
        "extension, /v2/logging) and a gateway its trace settings (/v2/trace/setting)",
    )

    retire_timeout_s: float = _shared(
        "retire_timeout_s",
        120.0,
        gt=0,
        description="longest a version taken out of service keeps its lanes for the requests "
        "it accepted",
    )
    uploads_dir: Path | None = _shared(
        "uploads_dir",
        None,
        description="where a service writes the model files that load requests carried "
        "(default: weir-uploads in the temporary directory)",
    )
    uploads_keep_s: float = _shared(
        "uploads_keep_s",
        600.0,
        gt=0,
        description="how long the files of an upload no model uses any more stay on a host "
        "before a service removes them",
    )
    model_store: Path | None = _shared(
        "model_store",
        None,
        description="a TorchServe model store (.mar archives): the gateway serves "
        "TorchServe's management API and registers archives from it into the repository",
    )
    default_max_batch_size: int = _shared(
        "default_max_batch_size",
        4,
        ge=0,
        description="max_batch_size that auto-complete gives a model that can batch when its "
        "config sets none (Triton's --backend-config=default-max-batch-size)",
    )
    autocomplete_timeout_s: float = _shared(
        "autocomplete_timeout_s",
        DEFAULT_PYTHON_TIMEOUT_S,
        gt=0,
        description="longest a Triton Python model's auto_complete_config may run (in a "
        "process of its own) before its model fails to load",
    )

    @property
    def completion(self) -> Completion:
        """How this service's repository reads complete configs."""
        return Completion(self.default_max_batch_size, self.autocomplete_timeout_s)

    @property
    def load_models(self) -> list[str]:
        return [name.strip() for name in self.load_model.split(",") if name.strip()]


class GatewaySettings(
    ServiceSettings, TorchServeGatewaySettings, TraceGatewaySettings, CacheGatewaySettings
):
    """The gateway: KServe v2 over HTTP and gRPC (``WEIR_GATEWAY_*``)."""

    model_config = SettingsConfigDict(env_prefix="WEIR_GATEWAY_")

    host: str = "0.0.0.0"
    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(8001, ge=0, le=65535, description="0: no gRPC endpoint")
    metrics_port: int = Field(8002, ge=0, le=65535, description="0: no metrics endpoint")
    processes: int = Field(1, ge=1, description="gateway processes sharing the ports")
    reuse_port: bool = Field(True, description="each process listens with SO_REUSEPORT")
    metrics_flush_s: float = Field(0.25, gt=0, description="processes > 1: metrics lag")
    body_limit_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_header_bytes: int = Field(
        64 * 1024, gt=0, description="largest HTTP request head (request line and headers), 431"
    )
    max_headers: int = Field(100, gt=0, description="most headers of an HTTP request, 431")
    header_timeout_s: float = Field(
        10.0, gt=0, description="longest an HTTP request head may take to arrive, 408"
    )
    body_idle_timeout_s: float = Field(
        30.0, gt=0, description="longest an HTTP request body may send nothing (then closed)"
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, description="longest a kept-alive HTTP connection may idle between requests"
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="most HTTP connections one gateway process holds, 503 past it (0: three "
        "quarters of its descriptor limit)",
    )
    metrics_cache_s: float = Field(
        0.0,
        ge=0,
        description="a metrics scrape reuses a render begun up to this long before it arrived "
        "(0: only the one it waited on)",
    )
    metrics_max_scrapes: int = Field(
        4, gt=0, description="metrics scrapes served at once (503 past it)"
    )
    grpc_max_concurrent_streams: int = Field(
        1000, gt=0, description="most calls at once on one gRPC connection"
    )
    grpc_max_connection_idle_s: float = Field(
        300.0, gt=0, description="a gRPC connection with no call for this long is closed"
    )
    grpc_keepalive_s: float = Field(
        60.0,
        gt=0,
        description="how often the gateway pings a gRPC client, so a dead peer's connection "
        "is found and closed (20 s to answer)",
    )
    max_inflight_requests: int = Field(
        8192, gt=0, description="requests one gateway process waits on at once, 503 past it"
    )
    max_inflight_bytes: int = Field(
        1024**3,
        gt=0,
        description="input bytes of the requests one gateway process waits on, 503 past it",
    )
    max_parameters: int = Field(
        64,
        ge=0,
        description="most request-level parameters one inference request may carry (400 / "
        "INVALID_ARGUMENT past it): they travel in its stream entry",
    )
    max_parameters_bytes: int = Field(
        64 * 1024,
        ge=0,
        description="largest size of an inference request's parameters, names and string "
        "values in UTF-8 bytes (a number or bool counts 8), 400 / INVALID_ARGUMENT past it",
    )
    default_max_queue_size: int = Field(
        1024,
        ge=0,
        description="max_queue_size of a model whose config sets none (or 0): 503 with "
        "Retry-After past it (0: unbounded, as Triton's default)",
    )
    admission_memory_fraction: float = Field(
        0.8,
        ge=0,
        le=1,
        description="new requests get 503 once Redis's used memory passes this share of its "
        "maxmemory, so the rest is left for answering what was accepted (0: no check of the "
        "gateway's own; Redis refuses at maxmemory)",
    )
    response_limit_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="largest sum of the output tensors' bytes one response carries, checked "
        "before it is rendered (413 / RESOURCE_EXHAUSTED past it)",
    )
    json_extra_items: int = Field(
        16_384,
        gt=0,
        description="commas, lists and objects a JSON infer body may hold beyond what its "
        "model's input shapes need (names, parameters, outputs); past it, 400 before parsing",
    )
    parse_inline_bytes: int = Field(
        256 * 1024,
        ge=0,
        description="infer bodies (HTTP or gRPC) up to this size are parsed on the event loop; "
        "larger ones in a parse thread, so they do not stall other requests",
    )
    parse_threads: int = Field(
        4, gt=0, description="threads parsing large infer bodies at once (more wait their turn)"
    )
    request_timeout_s: float = Field(60.0, gt=0)
    reply_read_count: int = Field(512, gt=0)
    reply_block_ms: int = Field(1000, gt=0)
    ready_cache_s: float = Field(
        0.5,
        ge=0,
        description="a readiness probe reuses a read of the live workers begun up to this "
        "long before (0: only one still running); a burst of probes costs one Redis call",
    )
    # Fail fast while Redis is down: a client gets 503 at once rather than a slow retry.
    redis_retries: int = Field(1, ge=0)
    retry_after_s: int = Field(1, ge=0, description="Retry-After on 503 responses")
    inference_token: SecretStr | None = Field(None, description="bearer token for inference")
    management_token: SecretStr | None = Field(None, description="bearer token for management")

    model_load_timeout_s: float = Field(
        300.0, gt=0, description="longest a load request waits for the mesh to serve the model"
    )
    model_upload_limit_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="model files a load request may carry, in all (0: no uploads)",
    )

    @field_validator("inference_token", "management_token")
    @classmethod
    def _empty_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty token would accept an empty bearer: it is no token at all (the gateway
        # warns at start that inference is open).
        if value is not None and not value.get_secret_value().strip():
            return None
        return value

    shared_memory_max_regions: int = Field(
        64,
        ge=0,
        description="system shared-memory regions one gateway process holds at once "
        "(0: registration is refused)",
    )
    shared_memory_max_region_bytes: int = Field(
        4 * 1024**3, gt=0, description="largest system shared-memory region one may register"
    )


class BatcherSettings(ServiceSettings):
    """The batcher (``WEIR_BATCHER_*``)."""

    model_config = SettingsConfigDict(env_prefix="WEIR_BATCHER_")

    read_count: int = Field(256, gt=0)
    block_ms: int = Field(1000, gt=0)
    trim_interval_s: float = Field(1.0, gt=0)
    reclaim_interval_s: float = Field(1.0, gt=0)
    reclaim_idle_ms: int = Field(1000, ge=0, description="idle time before claiming")
    work_conserving: bool = Field(
        True, description="send at once while a worker is idle; false: Triton's plain rule"
    )
    busy_hold_s: float = Field(
        1.0, ge=0, description="longest a request is held while every worker is busy"
    )
    free_probe_s: float = Field(
        0.002,
        gt=0,
        description="with other batchers on a stream: how often a lane holding requests and "
        "no credit asks whether an instance is free (a sibling may hold its credit)",
    )
    share_hold: float = Field(
        0.25,
        ge=0,
        description="a free instance beside a busy one of the same model waits for a batch "
        "as large as the one in flight, at most this fraction of the model's batch time "
        "(0: sends at once)",
    )


class WorkerSettings(ServiceSettings):
    """A worker pool (``WEIR_WORKER_*``)."""

    model_config = SettingsConfigDict(env_prefix="WEIR_WORKER_")

    pool: str = "cpu"
    name: str = Field("", description="consumer name (e.g. the pod name); empty: random")
    torch_threads: int = Field(
        0,
        ge=0,
        description="torch threads, shared out among the batches computing; 0: torch's default",
    )
    block_ms: int = Field(1000, gt=0)
    trim_interval_s: float = Field(1.0, gt=0)
    reclaim_interval_s: float = Field(1.0, gt=0)
    reclaim_idle_ms: int = Field(1000, ge=0, description="idle time before claiming")
    max_deliveries: int = Field(3, ge=1, description="deliveries before dead-lettering")
    reply_maxlen: int = Field(100_000, gt=0, description="approximate cap of a reply stream")
    trim_memory_idle_s: float = Field(
        2.0, ge=0, description="idle time before freed heap memory goes back (0: never)"
    )
    isolation_runs: int = Field(
        16,
        ge=0,
        description="extra backend calls per batch to find the requests a failed batch failed "
        "on, so its valid requests are answered (0: a failed batch fails every request)",
    )
    inline_compute_us: int = Field(
        300,
        ge=0,
        description="a model of several instances runs batches that recently cost less CPU "
        "time than this in the event loop, not a thread (0: every model always a thread)",
    )
    inline_block_us: int = Field(
        3000,
        ge=0,
        description="batches that recently took this long in wall time run in a thread; a "
        "model of one instance runs shorter ones in the event loop",
    )
    load_timeout_s: float = Field(
        0.0,
        ge=0,
        description="a version whose instances take this long to load and warm up is "
        "reported failed and the worker exits for its supervisor to replace (0: no limit); a "
        "model's load_timeout_s parameter overrides it",
    )
    inline_stall_s: float = Field(
        60.0,
        ge=0,
        description="a batch run in the event loop that lasts this long is dead-lettered and "
        "the worker exits for its supervisor to replace (0: no limit); by default the "
        "gateway's request timeout, when nobody waits for its answer any more",
    )
    ts_install_requirements: bool = Field(
        False,
        description="install a TorchServe archive's requirements.txt with pip when it loads "
        "(TorchServe's install_py_dep_per_model)",
    )
    ts_decode_input_request: bool = Field(
        True,
        description="TorchServe archives' handlers get JSON and text inputs decoded (TorchServe's "
        "decode_input_request); false: their bytes. A handler that sets TS_DECODE_INPUT_REQUEST "
        "when it loads chooses for itself",
    )
    handler_metrics_interval_s: float = Field(
        2.0,
        gt=0,
        description="how often what TorchServe handlers record (context.metrics) is published "
        "to Redis for the metrics port (each publication lives three intervals)",
    )
    gpu_metrics_interval_s: float = Field(
        2.0,
        gt=0,
        description="gpu pool: how often NVML is sampled into Redis for the gateway's nv_gpu_* "
        "metrics (each sample lives three intervals)",
    )
