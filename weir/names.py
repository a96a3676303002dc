"""Every Redis key and stream name Weir uses, in one place.

Names that belong to one model carry the model in a hash tag (``{model}``) so that a Redis
Cluster keeps each model's streams, counters and scripts' keys on one slot.
"""

from __future__ import annotations

PREFIX = "weir"

BATCHER_GROUP = "batcher"
WORKER_GROUP = "workers"
# Gateways are no stream group; they heartbeat under this name so peers find the dead ones.
GATEWAY_GROUP = "gateways"
# Triton's log settings for the whole mesh (weir.log_settings), set through any gateway.
LOG_SETTINGS = f"{PREFIX}:log_settings"
# Triton's trace settings (gateway.tracing): field "" the global ones, a model's name its own.
TRACE_SETTINGS = f"{PREFIX}:trace_settings"


def _model_key(model: str, version: str, kind: str) -> str:
    return f"{PREFIX}:{{{model}}}:{version}:{kind}"


def request_stream(model: str, version: str) -> str:
    """Requests for one (model, version), written by gateways, read by batchers."""
    return _model_key(model, version, "requests")


def batch_stream(model: str, version: str) -> str:
    """Formed batches for one (model, version), written by batchers, read by workers."""
    return _model_key(model, version, "batches")


def credit_stream(model: str, version: str) -> str:
    """Free instance slots that workers announce, read by batchers (work-conserving)."""
    return _model_key(model, version, "credits")


def dead_letter_stream(model: str, version: str) -> str:
    """Batches delivered too often, kept for inspection and replay."""
    return _model_key(model, version, "dead")


def queued_counter(model: str, version: str) -> str:
    """Requests accepted and not yet answered by a worker or the batcher."""
    return _model_key(model, version, "queued")


def level_counts(model: str, version: str) -> str:
    """Hash: requests waiting to be batched, per priority level with a queue bound of its own."""
    return _model_key(model, version, "level-counts")


def cancel_stream(model: str, version: str) -> str:
    """Ids of requests their clients gave up on, for batchers and workers to drop (weir.cancels)."""
    return _model_key(model, version, "cancels")


def model_stats(model: str, version: str) -> str:
    """A hash of counters that workers record per executed batch."""
    return _model_key(model, version, "stats")


def sequence_states(model: str, version: str) -> str:
    """Hash: a sequence model's open sequences, each with its implicit state (or empty)."""
    return _model_key(model, version, "sequences")


def sequence_lease(model: str, version: str) -> str:
    """String: the batcher that batches a sequence model (batcher.sequences)."""
    return _model_key(model, version, "sequence-lease")


def timed_out_load(model: str, version: str, pool: str) -> str:
    """The load attempt of a version that ran past its timeout in a pool, and why."""
    return _model_key(model, version, f"load-timed-out:{pool}")


def route_state(request_id: str) -> str:
    """The tensors and step claims of one pipeline request, while it runs."""
    return f"{PREFIX}:route:{{{request_id}}}"


def reply_stream(gateway_id: str) -> str:
    """Replies for the requests that one gateway process took."""
    return f"{PREFIX}:reply:{gateway_id}"


def call_reply_stream(worker_id: str) -> str:
    """Replies to the calls one worker's models made to other models (workers.bls)."""
    return f"{PREFIX}:calls:{worker_id}"


# A group's liveness registry is two keys under one hash tag, so the scripts of
# weir.liveness that read and write both touch one Redis Cluster slot.
def live_values(group: str) -> str:
    """The live consumers of ``group``: a hash, consumer -> what its heartbeat says."""
    return f"{PREFIX}:{{live:{group}}}:values"


def live_expiry(group: str) -> str:
    """When each consumer of ``group`` stops counting as live: a sorted set, score unix ms."""
    return f"{PREFIX}:{{live:{group}}}:expiry"


def serving_versions(model: str) -> str:
    """The versions of a model that admit new requests (a set; model control modes only).

    Admission checks it in the same script that queues a request, so a version taken out of
    service refuses new requests at once while the ones it accepted drain.
    """
    return f"{PREFIX}:{{{model}}}:serving"


# The control plane's keys share one hash tag, so a compare-and-set over both is one slot.
def desired_state() -> str:
    """What the mesh should serve: models, versions, configs, weights (msgpack)."""
    return f"{PREFIX}:{{control}}:desired"


def desired_generation() -> str:
    """The desired state's generation number, which every service polls."""
    return f"{PREFIX}:{{control}}:generation"


def uploaded_files(digest: str) -> str:
    """The files a load request carried (a hash: path in the model directory -> bytes)."""
    return f"{PREFIX}:{{control}}:files:{digest}"


# A GPU's NVML sample (see workers.gpu_metrics): the hash's fields, read by the gateway.
GPU_UUID = "gpu_uuid"
GPU_UTILIZATION = "utilization"  # 0..1
GPU_MEMORY_TOTAL_BYTES = "memory_total_bytes"
GPU_MEMORY_USED_BYTES = "memory_used_bytes"
GPU_POWER_USAGE_W = "power_usage_w"
GPU_POWER_LIMIT_W = "power_limit_w"
GPU_ENERGY_J = "energy_j"  # since the driver loaded


def gpu_stats(gpu_uuid: str) -> str:
    """One GPU's latest NVML sample (a hash), with a TTL a gpu-pool worker keeps refreshing.

    Keyed by the GPU, not the worker: workers sharing a GPU write the same hash, and a GPU
    no live worker samples drops out of the metrics when its key expires.
    """
    return f"{PREFIX}:gpu:{gpu_uuid}"


def gpu_stats_pattern() -> str:
    return f"{PREFIX}:gpu:*"


def handler_metrics(worker: str) -> str:
    """What a worker's TorchServe handlers recorded (a hash of series, weir.handler_metrics).

    The worker rewrites it every few seconds with a TTL of a few intervals: the series of a
    worker that died drop out of the metrics when its key expires.
    """
    return f"{PREFIX}:handler-metrics:{worker}"


def handler_metrics_pattern() -> str:
    return f"{PREFIX}:handler-metrics:*"
