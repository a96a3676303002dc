"""A gpu-pool worker's NVML samples, published to Redis for the gateway's ``nv_gpu_*`` metrics.

The gateway serves the mesh's metrics but runs on no GPU, so each gpu-pool worker samples its
visible GPUs every ``gpu_metrics_interval_s`` and writes one hash per GPU
(:func:`weir.names.gpu_stats`) with a TTL of a few intervals: a GPU whose workers died drops
out of the metrics by itself. ``pynvml`` (the ``nvidia-ml-py`` package, the ``gpu`` extra) is
imported here only, when the gpu pool starts sampling; the cpu pool never loads it. Without
it, or without a driver, the worker logs why once and serves on without GPU metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from weir import names

logger = logging.getLogger(__name__)

TTL_INTERVALS = 3  # a sample outlives two missed ones

Sample = Mapping[str, str | float | int]


async def publish(redis: Redis, samples: list[Sample], ttl_s: float) -> None:
    """Write each GPU's sample as its hash, expiring in ``ttl_s``, in one round trip.

    Each hash is deleted first so that a field NVML stopped reporting does not linger.
    """
    # Not a transaction: the GPUs' keys may sit on different slots of a Redis Cluster.
    pipe = redis.pipeline(transaction=False)
    for sample in samples:
        key = names.gpu_stats(str(sample[names.GPU_UUID]))
        pipe.delete(key)
        fields: dict[FieldT, EncodableT] = {k: v for k, v in sample.items()}
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, max(int(ttl_s * 1000), 1))
    await pipe.execute()


def load_nvml() -> Any | None:
    """``pynvml``, initialised; None, with one warning saying why, where it cannot be."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError as exc:
        logger.warning("no GPU metrics: pynvml (nvidia-ml-py) cannot be imported: %s", exc)
        return None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        logger.warning("no GPU metrics: NVML cannot start: %s", exc)
        return None
    return nvml


def read_devices(nvml: Any) -> list[Sample]:
    """One sample per visible GPU (blocking NVML calls: run it in a thread)."""
    return [read_device(nvml, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(_count(nvml))]


def _count(nvml: Any) -> int:
    return int(nvml.nvmlDeviceGetCount())


def read_device(nvml: Any, handle: Any) -> Sample:
    """A GPU's readings in Triton's units; a reading the GPU does not support is left out."""
    uuid = nvml.nvmlDeviceGetUUID(handle)
    sample: dict[str, str | float | int] = {
        names.GPU_UUID: uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    }
    readings: dict[str, Callable[[], float | int]] = {
        names.GPU_UTILIZATION: lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100,
        names.GPU_MEMORY_TOTAL_BYTES: lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        names.GPU_MEMORY_USED_BYTES: lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
        names.GPU_POWER_USAGE_W: lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
        names.GPU_POWER_LIMIT_W: lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        names.GPU_ENERGY_J: lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000,
    }
    for field, read in readings.items():
        with contextlib.suppress(nvml.NVMLError):
            sample[field] = read()
    return sample


class GpuSampler:
    """Samples NVML every ``interval_s`` into Redis until ``should_exit``; never raises.

    Energy is NVML's total since the driver loaded, not since this worker started (Triton's
    base): several workers may share a GPU's hash, and only the driver's total is the same
    whichever of them wrote last, so the counter never steps back.
    """

    def __init__(self, redis: Redis, interval_s: float) -> None:
        self.redis = redis
        self.interval_s = interval_s

    async def run(self, should_exit: asyncio.Event) -> None:
        nvml = load_nvml()
        if nvml is None:
            return
        try:
            while not should_exit.is_set():
                await self.sample_once(nvml)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(should_exit.wait(), self.interval_s)
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    async def sample_once(self, nvml: Any) -> None:
        """Read and publish one sample; a failure is logged and the next interval tries again."""
        try:
            samples = await asyncio.to_thread(read_devices, nvml)
            await publish(self.redis, samples, self.interval_s * TTL_INTERVALS)
        except Exception as exc:  # metrics never stop the worker: NVMLError, RedisError, ...
            logger.warning("GPU metrics sample skipped: %s", exc)
