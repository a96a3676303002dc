"""Server and model metadata, model config and statistics, in Triton's JSON shapes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.asyncio import Redis

from weir import __version__, datatypes, names
from weir.config import Backend, ModelConfig, TensorSpec
from weir.repository import ModelEntry

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics"]

PLATFORMS: dict[Backend, str] = {
    Backend.PYTORCH: "pytorch_libtorch",
    Backend.ONNXRUNTIME: "onnxruntime_onnx",
    Backend.OPENVINO: "openvino",
    Backend.TENSORRT: "tensorrt_plan",
    Backend.PYTHON: "python",
    Backend.ENSEMBLE: "ensemble",
}


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
    config = entry.config
    raw = config.model_dump(mode="json", exclude_none=True)
    for key in ("input", "output"):
        for tensor in raw[key]:
            tensor["data_type"] = datatypes.PROTOCOL_TO_CONFIG[tensor["data_type"]]
    raw["platform"] = PLATFORMS[config.backend]
    raw["parameters"] = {k: {"string_value": v} for k, v in config.parameters.items()}
    return raw


async def read_statistics(
    redis: Redis, entry: ModelEntry, version: str | None
) -> list[dict[str, Any]]:
    """The statistics of ``version``, or of every served version, as the workers recorded."""
    versions = [version] if version else list(entry.versions)
    stats = []
    for v in versions:
        recorded = await redis.hgetall(names.model_stats(entry.name, v))
        stats.append(model_statistics(entry.name, v, recorded))
    return stats


def model_statistics(
    name: str, version: str, recorded: Mapping[bytes | str, bytes | str]
) -> dict[str, Any]:
    """Triton's statistics extension, from the counters the workers record per batch."""
    counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in recorded.items()}
    batches = sorted(
        (int(key.split(":", 1)[1]), count)
        for key, count in counts.items()
        if key.startswith("batch_size:")
    )
    return {
        "name": name,
        "version": version,
        "inference_count": counts.get("inference_count", 0),
        "execution_count": counts.get("execution_count", 0),
        "inference_stats": _inference_stats(counts),
        "batch_stats": [
            {"batch_size": size, "compute_infer": {"count": count}} for size, count in batches
        ],
    }


def _inference_stats(counts: dict[str, int]) -> dict[str, dict[str, int]]:
    """Per request, as Triton counts them: each request counts its batch's compute time."""
    succeeded = counts.get("success_count", 0)
    phases = ("queue", "compute_input", "compute_infer", "compute_output")
    stats = {phase: {"count": succeeded, "ns": counts.get(f"{phase}_ns", 0)} for phase in phases}
    stats["success"] = {"count": succeeded, "ns": sum(s["ns"] for s in stats.values())}
    stats["fail"] = {"count": counts.get("fail_count", 0), "ns": 0}
    return stats
