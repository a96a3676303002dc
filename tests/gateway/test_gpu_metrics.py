"""The gateway's /metrics carries Triton's GPU series from the hashes gpu-pool workers write."""

from __future__ import annotations

import asyncio

import redis
from prometheus_client import CollectorRegistry, generate_latest
from redis.asyncio import Redis

from gateway.exporter import MeshCollector
from tests.conftest import wait_until
from weir import names
from weir.redis_server import RedisServer
from workers.gpu_metrics import publish

UUID_A = "GPU-00000000-aaaa-bbbb-cccc-000000000001"
UUID_B = "GPU-00000000-aaaa-bbbb-cccc-000000000002"


def sample(uuid: str, used_bytes: int) -> dict[str, str | float | int]:
    return {
        names.GPU_UUID: uuid,
        names.GPU_UTILIZATION: 0.42,
        names.GPU_MEMORY_TOTAL_BYTES: 85_899_345_920,
        names.GPU_MEMORY_USED_BYTES: used_bytes,
        names.GPU_POWER_USAGE_W: 71.5,
        names.GPU_POWER_LIMIT_W: 700.0,
        names.GPU_ENERGY_J: 3_594_017.4,
    }


def scrape(url: str) -> str:
    registry = CollectorRegistry()
    registry.register(MeshCollector(url, [], follow=False))
    return generate_latest(registry).decode()


def series(text: str, name: str) -> dict[str, float]:
    """``name``'s samples by their gpu_uuid label."""
    found = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('gpu_uuid="', 1)[1].split('"', 1)[0]] = float(value)
    return found


async def test_gpu_series_carry_each_gpu_and_vanish_with_its_hash(
    redis_server: RedisServer,
) -> None:
    client = Redis.from_url(redis_server.url)
    try:
        await publish(client, [sample(UUID_A, 1024), sample(UUID_B, 2048)], ttl_s=60)
        text = await asyncio.to_thread(scrape, redis_server.url)
        assert series(text, "nv_gpu_utilization") == {UUID_A: 0.42, UUID_B: 0.42}
        assert series(text, "nv_gpu_memory_total_bytes")[UUID_A] == 85_899_345_920
        assert series(text, "nv_gpu_memory_used_bytes") == {UUID_A: 1024, UUID_B: 2048}
        assert series(text, "nv_gpu_power_usage")[UUID_B] == 71.5
        assert series(text, "nv_gpu_power_limit")[UUID_B] == 700.0
        assert series(text, "nv_energy_consumption") == {UUID_A: 3_594_017.4, UUID_B: 3_594_017.4}
        assert "# TYPE nv_gpu_utilization gauge" in text
        assert "nv_energy_consumption_total{" not in text  # Triton's name, exactly

        await client.delete(names.gpu_stats(UUID_B))
        text = await asyncio.to_thread(scrape, redis_server.url)
        assert series(text, "nv_gpu_memory_used_bytes") == {UUID_A: 1024}

        await publish(client, [sample(UUID_A, 4096)], ttl_s=0.2)  # a dead worker's last sample
        text = await asyncio.to_thread(scrape, redis_server.url)
        assert series(text, "nv_gpu_memory_used_bytes") == {UUID_A: 4096}
        key = names.gpu_stats(UUID_A)
        await asyncio.to_thread(
            wait_until, lambda: not key_exists(redis_server.url, key), 5, "the sample to expire"
        )
        text = await asyncio.to_thread(scrape, redis_server.url)
        assert "nv_gpu" not in text
        assert "nv_energy" not in text
    finally:
        await client.delete(names.gpu_stats(UUID_A), names.gpu_stats(UUID_B))
        await client.aclose()


def key_exists(url: str, key: str) -> bool:
    with redis.Redis.from_url(url) as client:
        return bool(client.exists(key))


def test_no_gpu_hash_no_gpu_series(redis_server: RedisServer) -> None:
    text = scrape(redis_server.url)
    assert "nv_gpu" not in text
    assert "nv_energy" not in text
