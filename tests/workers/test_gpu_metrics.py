"""GPU metrics stay in the gpu pool, and a gpu pool without NVML serves on without them."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from weir import names
from weir.redis_server import RedisServer
from workers.gpu_metrics import GpuSampler

ROOT = Path(__file__).resolve().parents[2]
HAS_PYNVML = importlib.util.find_spec("pynvml") is not None


@pytest.mark.skipif(HAS_PYNVML, reason="this machine has pynvml: the device check covers it")
async def test_without_nvml_the_sampler_warns_once_and_publishes_nothing(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = Redis.from_url(redis_server.url)
    try:
        with caplog.at_level(logging.WARNING, logger="workers.gpu_metrics"):
            await asyncio.wait_for(GpuSampler(client, 0.05).run(asyncio.Event()), 5)
        warnings = [r.getMessage() for r in caplog.records if r.name == "workers.gpu_metrics"]
        assert len(warnings) == 1
        assert "pynvml" in warnings[0]
        assert [key async for key in client.scan_iter(match=names.gpu_stats_pattern())] == []
    finally:
        await client.aclose()


# A worker of one pool through startup and a moment of run(), then a clean shutdown. A
# pynvml stand-in on the path records whether anything imported it (it has no nvmlInit, so
# a gpu pool that does import it must warn and serve on).
POOL = """
import asyncio, json, sys
from pathlib import Path

from weir.settings import WorkerSettings
from workers.service import Worker

async def serve() -> None:
    settings = WorkerSettings(
        redis_url=sys.argv[2], repository=Path(sys.argv[1]), pool=sys.argv[3],
        gpu_metrics_interval_s=0.05,
    )
    worker = Worker(settings)
    await worker.startup()
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(0)  # one turn of the loop: run() has spawned its tasks
    sampler = [t for t in asyncio.all_tasks() if t.get_name() == "gpu metrics"]
    if sampler:  # the gpu pool's: it gives up at once without NVML
        await asyncio.wait_for(sampler[0], 10)
    assert not running.done(), "the worker stopped"
    worker.should_exit.set()
    await running
    await worker.shutdown()

asyncio.run(serve())
print(json.dumps({"pynvml_imported": "pynvml" in sys.modules}))
"""


def run_pool(pool: str, redis_server: RedisServer, tmp_path: Path) -> tuple[dict[str, bool], str]:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    stand_in = tmp_path / "site"
    stand_in.mkdir(exist_ok=True)
    (stand_in / "pynvml.py").write_text('"""Not NVML: it only shows who imports it."""\n')
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    result = subprocess.run(
        [sys.executable, str(script), str(models), redis_server.url, pool],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{stand_in}"},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def test_the_cpu_pool_never_imports_pynvml(redis_server: RedisServer, tmp_path: Path) -> None:
    report, _ = run_pool("cpu", redis_server, tmp_path)
    assert report["pynvml_imported"] is False


def test_a_gpu_pool_without_working_nvml_warns_and_serves_on(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    report, stderr = run_pool("gpu", redis_server, tmp_path)
    assert report["pynvml_imported"] is True  # the stand-in shows the check above can fail
    assert stderr.count("no GPU metrics: NVML cannot start") == 1
