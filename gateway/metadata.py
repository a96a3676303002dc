"""Server and model metadata, model config and statistics, in Triton's JSON shapes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from weir import __version__, names
from weir.config import ModelConfig, TensorSpec
from weir.config_json import PLATFORMS, config_json
from weir.repository import ModelEntry
from weir.stats import (
    COMPUTE_PHASES,
    REQUEST_PHASES,
    Field,
    batch_phase_field,
    batch_sizes,
    phase_field,
)

# The KServe v2 / Triton extensions Weir implements, as Triton names them in server metadata.
EXTENSIONS = [
    "classification",
    "binary_tensor_data",
    "parameters",
    "model_configuration",
    "statistics",
    "system_shared_memory",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
    "trace",
]


def server_metadata() -> dict[str, Any]:
    return {"name": "weir", "version": __version__, "extensions": EXTENSIONS}


def model_metadata(entry: ModelEntry, version: str | None) -> dict[str, Any]:
    config = entry.config
    return {
        "name": entry.name,
        "versions": [version] if version else list(entry.versions),
        "platform": PLATFORMS[config.backend],
        "inputs": [_tensor_metadata(config, spec) for spec in config.input],
        "outputs": [_tensor_metadata(config, spec) for spec in config.output],
    }


def _tensor_metadata(config: ModelConfig, spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": config.full_shape(spec)}


def model_config(entry: ModelEntry) -> dict[str, Any]:
    """The config as Triton's JSON form of ``ModelConfig``."""
    return config_json(entry.config)


async def read_statistics(
    redis: Redis, entries: Sequence[tuple[ModelEntry, str | None]]
) -> list[dict[str, Any]]:
    """Statistics of each (model, version), every served version where version is None.

    Read in one pipelined round trip, as the workers recorded them.
    """
    lanes = [(e.name, v) for e, version in entries for v in ([version] if version else e.versions)]
    pipe = redis.pipeline(transaction=False)
    for name, version in lanes:
        pipe.hgetall(names.model_stats(name, version))
    recorded = await pipe.execute() if lanes else []
    return [model_statistics(n, v, r) for (n, v), r in zip(lanes, recorded, strict=True)]


def model_statistics(
    name: str, version: str, recorded: Mapping[bytes | str, bytes | str]
) -> dict[str, Any]:
    """Triton's statistics extension, from the counters the workers record per batch."""
    counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in recorded.items()}
    return {
        "name": name,
        "version": version,
        "last_inference": counts.get(Field.LAST_INFERENCE, 0),
        "inference_count": counts.get(Field.INFERENCE_COUNT, 0),
        "execution_count": counts.get(Field.EXECUTION_COUNT, 0),
        "inference_stats": _inference_stats(counts),
        "batch_stats": _batch_stats(counts),
    }


def _inference_stats(counts: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per request, as Triton counts them: each request counts its batch's compute time.

    ``success`` and ``fail`` take each request's whole time in the server, from the gateway
    taking it to the worker recording it; an answer from a gateway's response cache is a
    success too, and a ``cache_hit``, with no queue or compute time.
    """
    succeeded = counts.get(Field.SUCCESS_COUNT, 0)
    stats = {"success": {"count": succeeded, "ns": counts.get(Field.SUCCESS_NS, 0)}}
    stats["fail"] = {"count": counts.get(Field.FAIL_COUNT, 0), "ns": counts.get(Field.FAIL_NS, 0)}
    computed = succeeded - counts.get(Field.CACHE_HIT_COUNT, 0)  # hits run no phase
    for phase in REQUEST_PHASES:
        stats[phase.name] = {"count": computed, "ns": counts.get(phase_field(phase), 0)}
    for name, count, ns in (
        ("cache_hit", Field.CACHE_HIT_COUNT, Field.CACHE_HIT_NS),
        ("cache_miss", Field.CACHE_MISS_COUNT, Field.CACHE_MISS_NS),
    ):
        stats[name] = {"count": counts.get(count, 0), "ns": counts.get(ns, 0)}
    return stats


def _batch_stats(counts: dict[str, int]) -> list[dict[str, Any]]:
    """One entry per batch size executed: its executions and each compute phase's time."""
    return [
        {
            "batch_size": size,
            **{
                phase.name: {"count": count, "ns": counts.get(batch_phase_field(phase, size), 0)}
                for phase in COMPUTE_PHASES
            },
        }
        for size, count in sorted(batch_sizes(counts).items())
    ]
