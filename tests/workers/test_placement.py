"""Device placement: which pool runs a model's instance groups, on which devices, and the
clear refusals of a gpu pool that cannot place a model (never a model silently on the CPU).

The arithmetic is checked against stated device counts; the refusals with real
``weir worker --pool gpu`` processes against a real redis-server, with
``CUDA_VISIBLE_DEVICES=''`` so that no machine, with a GPU or without, shows them a device.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml

from tests.conftest import ROOT, private_mesh
from weir.config import ModelConfig
from weir.errors import ConfigError
from weir.redis_server import RedisServer
from workers.placement import (
    POOL_KINDS,
    Devices,
    Placement,
    instance_count,
    place,
    placements,
    visible_devices,
)

TWO = Devices(2, "CUDA_VISIBLE_DEVICES='4,5'")
NONE = Devices(0, "torch.cuda.is_available() is false; CUDA_VISIBLE_DEVICES=''")
NO_TENSORRT = importlib.util.find_spec("tensorrt") is None


def config(*groups: dict[str, Any], backend: str = "pytorch", name: str = "m") -> ModelConfig:
    return ModelConfig.model_validate(raw_config(*groups, backend=backend, name=name))


def raw_config(
    *groups: dict[str, Any], backend: str = "pytorch", name: str = "m"
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": name,
        "backend": backend,
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
    }
    if groups:
        raw["instance_group"] = list(groups)
    return raw


def devices(placed: list[Placement]) -> list[int | None]:
    return [p.device for p in placed]


# --- the arithmetic ---------------------------------------------------------------------------


def test_a_gpu_group_counts_its_instances_per_listed_gpu() -> None:
    model = config({"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]})
    placed = placements(model, "gpu", TWO)
    assert placed == [Placement(0, "m_0")] * 2 + [Placement(1, "m_0")] * 2
    assert instance_count(model, "gpu") == 4  # listed GPUs need no device count


def test_an_empty_gpus_means_every_visible_device() -> None:
    model = config({"kind": "KIND_GPU", "count": 1, "name": "fast"})
    assert placements(model, "gpu", Devices(3)) == [Placement(d, "fast") for d in (0, 1, 2)]
    assert instance_count(model, "gpu", visible_gpus=3) == 3


@pytest.mark.parametrize(
    ("kind", "cpu", "gpu"),
    [
        ("KIND_CPU", [None, None], []),
        ("KIND_MODEL", [None, None], []),
        ("KIND_GPU", [], [0, 0, 1, 1]),
        # Triton's "a GPU when there is one": the gpu pool's devices, and the cpu pool's CPU.
        ("KIND_AUTO", [None, None], [0, 0, 1, 1]),
    ],
)
def test_each_kind_runs_in_its_pools(kind: str, cpu: list[int | None], gpu: list[int]) -> None:
    model = config({"kind": kind, "count": 2})
    assert devices(placements(model, "cpu", TWO)) == cpu
    assert devices(placements(model, "gpu", TWO)) == gpu
    assert instance_count(model, "cpu") == len(cpu)
    assert instance_count(model, "gpu", visible_gpus=2) == len(gpu)


def test_a_model_without_instance_group_is_kind_auto_in_both_pools() -> None:
    model = config()
    assert placements(model, "cpu", TWO) == [Placement(None, "m_0")]
    assert devices(placements(model, "gpu", TWO)) == [0, 1]
    assert set(POOL_KINDS) == {"cpu", "gpu"}


def test_mixed_groups_split_between_the_pools_in_group_order() -> None:
    model = config(
        {"kind": "KIND_CPU", "count": 2},
        {"kind": "KIND_GPU", "count": 1, "gpus": [1], "name": "fast"},
        {"kind": "KIND_AUTO", "count": 1},
    )
    assert placements(model, "cpu", TWO) == [
        Placement(None, "m_0"),
        Placement(None, "m_0"),
        Placement(None, "m_2"),
    ]
    assert placements(model, "gpu", TWO) == [
        Placement(1, "fast"),
        Placement(0, "m_2"),
        Placement(1, "m_2"),
    ]
    assert instance_count(model, "gpu", visible_gpus=2) == 3


def test_openvino_runs_in_the_cpu_pool_only() -> None:
    auto = config(backend="openvino")
    assert instance_count(auto, "gpu", visible_gpus=2) == 0  # KIND_AUTO: its CPU
    assert devices(placements(auto, "cpu", TWO)) == [None]
    with pytest.raises(ConfigError, match="'openvino' runs on the CPU only; give its"):
        placements(config({"kind": "KIND_GPU"}, backend="openvino"), "gpu", TWO)


@pytest.mark.parametrize("gpus", [[3], [0, 2], [-1]])
def test_a_gpu_the_worker_does_not_see_is_named(gpus: list[int]) -> None:
    model = config({"kind": "KIND_GPU", "gpus": gpus, "name": "big"})
    with pytest.raises(ConfigError) as raised:
        placements(model, "gpu", TWO)
    message = str(raised.value)
    missing = ", ".join(str(g) for g in gpus if not 0 <= g < 2)
    assert message.startswith(f"model 'm': instance_group 'big' lists GPU {missing}, ")
    assert "sees 2 CUDA devices, ids 0 to 1 (CUDA_VISIBLE_DEVICES='4,5')" in message


@pytest.mark.parametrize("kind", ["KIND_GPU", "KIND_AUTO"])
def test_no_cuda_device_refuses_a_gpu_pool_group(kind: str) -> None:
    with pytest.raises(ConfigError) as raised:
        placements(config({"kind": kind, "gpus": [0]}), "gpu", NONE)
    message = str(raised.value)
    assert message.startswith(f"model 'm': instance_group kind {kind}")
    assert "needs a CUDA device, and this worker sees none (" in message
    assert NONE.detail in message


def test_tensorrt_runs_in_the_gpu_pool_only() -> None:
    auto = config(backend="tensorrt_plan")
    assert instance_count(auto, "cpu") == 0  # KIND_AUTO: an engine needs the GPU
    assert devices(placements(auto, "gpu", TWO)) == [0, 1]
    with pytest.raises(ConfigError, match="'tensorrt' runs on CUDA devices only"):
        placements(config({"kind": "KIND_CPU"}, backend="tensorrt"), "cpu", Devices(0))


def test_the_gpu_pool_never_places_a_model_on_this_machines_cpu() -> None:
    """Every instance it places is on a CUDA device; with none seen, it refuses."""
    seen = visible_devices()
    if seen.count:
        assert {p.device for p in place(config({"kind": "KIND_GPU"}), "gpu")} == {0}
        return
    with pytest.raises(ConfigError, match="needs a CUDA device, and this worker sees none"):
        place(config({"kind": "KIND_GPU"}), "gpu")


# --- the cpu pool never touches CUDA ----------------------------------------------------------

CPU_POOL = """
import asyncio, json, sys
from pathlib import Path

import workers.service
from weir.repository import Repository
from workers.placement import place

repository = Repository.load(Path(sys.argv[1]))
placed = [len(place(entry.config, "cpu")) for entry in repository]
placing_imported_torch = "torch" in sys.modules

from weir.settings import WorkerSettings

async def serve() -> None:
    worker = workers.service.Worker(
        WorkerSettings(redis_url=sys.argv[2], repository=Path(sys.argv[1]))
    )
    await worker.startup()
    await worker.shutdown()

asyncio.run(serve())
import torch

print(json.dumps({
    "placed": placed,
    "placing_imported_torch": placing_imported_torch,
    "cuda_initialized": torch.cuda.is_initialized(),
}))
"""


def test_the_cpu_pool_never_initialises_cuda(redis_server: RedisServer, tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_torch_model(models, "auto", raw_config())  # KIND_AUTO: a GPU when there is one
    write_torch_model(models, "cpu", raw_config({"kind": "KIND_CPU", "count": 2}))
    script = tmp_path / "cpu_pool.py"
    script.write_text(CPU_POOL)
    result = subprocess.run(
        [sys.executable, str(script), str(models), redis_server.url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(report["placed"]) == [1, 2]
    assert report["placing_imported_torch"] is False
    assert report["cuda_initialized"] is False


# --- a gpu worker refuses what it cannot place ------------------------------------------------


def write_torch_model(models: Path, name: str, raw: dict[str, Any]) -> None:
    (models / name / "1").mkdir(parents=True)
    (models / name / "config.yaml").write_text(yaml.safe_dump({**raw, "name": name}))
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(models / name / "1" / "model.pt"))


def write_tensorrt_model(models: Path, name: str) -> None:
    (models / name / "1").mkdir(parents=True)
    raw = {**raw_config(), "name": name, "platform": "tensorrt_plan"}
    del raw["backend"]
    (models / name / "config.yaml").write_text(yaml.safe_dump(raw))  # KIND_AUTO
    (models / name / "1" / "model.plan").write_bytes(b"not an engine")


def gpu_worker_env(redis_url: str, models: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "WEIR_REDIS_URL": redis_url,
        "WEIR_REPOSITORY": str(models),
        "WEIR_WORKER_TORCH_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",  # no device, on any machine
        **extra,
    }


def run_gpu_worker(redis_url: str, models: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weir.cli", "worker", "--pool", "gpu"],
        cwd=ROOT,
        env=gpu_worker_env(redis_url, models),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_gpu_worker_without_a_cuda_device_stops_naming_the_model(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    write_torch_model(models, "big_mlp", raw_config({"kind": "KIND_GPU", "count": 2}))
    result = run_gpu_worker(redis_server.url, models)
    assert result.returncode == 2, result.stderr
    assert (
        "weir worker: model 'big_mlp': instance_group kind KIND_GPU "
        "needs a CUDA device, and this worker sees none (torch.cuda.is_available() is false"
    ) in result.stderr
    assert "CUDA_VISIBLE_DEVICES='')" in result.stderr
    assert "lane big_mlp" not in result.stderr  # nothing was loaded, on the CPU or elsewhere


@pytest.mark.skipif(not NO_TENSORRT, reason="the tensorrt module is installed here")
def test_a_tensorrt_model_without_the_tensorrt_module_says_so(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    write_tensorrt_model(models, "engine")
    result = run_gpu_worker(redis_server.url, models)
    assert result.returncode == 2, result.stderr
    assert (
        "model 'engine': backend 'tensorrt' needs the tensorrt module, and this worker cannot "
        "import it (No module named 'tensorrt'): pip install tensorrt-cu12"
    ) in result.stderr


GPU_WORKER_EXPLICIT = ["worker", "--pool", "gpu", "--model-control-mode", "explicit"]


@pytest.mark.timeout(120)
def test_in_mode_explicit_the_failure_is_the_models_load_failure(tmp_path: Path) -> None:
    models = tmp_path / "models"
    write_torch_model(models, "big_mlp", raw_config({"kind": "KIND_GPU"}))
    with private_mesh(models, {"WEIR_MODEL_CONTROL_MODE": "explicit"}) as mesh:
        worker = subprocess.Popen(
            [sys.executable, "-m", "weir.cli", *GPU_WORKER_EXPLICIT],
            cwd=ROOT,
            env=gpu_worker_env(mesh.redis_url, models),
        )
        try:
            load = httpx.post(f"{mesh.url}/v2/repository/models/big_mlp/load", timeout=60)
            assert load.status_code == 400, load.text
            assert "needs a CUDA device, and this worker sees none" in load.json()["error"]
            index = httpx.post(f"{mesh.url}/v2/repository/index", json={}, timeout=10).json()
            (row,) = [r for r in index if r["name"] == "big_mlp"]
            assert row["state"] == "UNAVAILABLE"
            assert row["reason"].startswith(
                "load failed: model 'big_mlp': instance_group kind KIND_GPU needs a CUDA device"
            )
            assert worker.poll() is None  # the worker reports it and goes on
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
