"""The gpu pool on a real CUDA device: run by tests/gpu/device_check.sh on a GPU machine.

Every test here is marked ``gpu`` and skipped where torch sees no CUDA device (CI, and any
machine without an NVIDIA GPU); the CPU-side logic they rest on (placement, the missing-CUDA
errors, provider options, metrics without NVML) is tested on the CPU in tests/workers/.
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
import signal
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import yaml

from tests.chaos.helpers import Topology, closed_loop, private_repository
from tests.conftest import EXAMPLES, http_ready, wait_until
from weir.redis_server import RedisServer, free_port
from weir.repository import load_model
from workers.backends import load_backend

CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason="no CUDA device: the device check runs these"),
]

# What the GPU tests serve: built on their own, as a GPU image may lack what the rest of the
# example repository needs (OpenVINO, all-MiniLM's weights package).
GPU_MODELS = ["tiny_mlp", "wide_mlp", "bert_mini", "tiny_mlp_onnx", "bert_mini_onnx"]
FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 2e-2  # an FP16 engine against the FP32 reference, on outputs of about 1


@pytest.fixture(scope="module")
def example_repository(build_models: ModuleType) -> Path:
    """The example repository with :data:`GPU_MODELS` built (this module's, not conftest's)."""
    for name in GPU_MODELS:
        build = build_models.build_model if name in build_models.MODELS else None
        (build or build_models.build_export)(EXAMPLES, name)
    return EXAMPLES


def on_gpu(repository: Path, name: str, count: int = 1, **extra: Any) -> None:
    """Give ``name``'s config in ``repository`` one KIND_GPU group of ``count``."""
    path = repository / name / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["instance_group"] = [{"kind": "KIND_GPU", "count": count}]
    raw.update(extra)
    path.write_text(yaml.safe_dump(raw))


def load(repository: Path, name: str, device: int | None, instances: int = 1) -> Any:
    """``name``'s backend from ``repository``, loaded alone (the examples not built here, such
    as OpenVINO's on an image without it, have no version directory to serve)."""
    entry = load_model(repository, name)
    return load_backend(entry.config, entry.version_path("1"), None, instances, None, device)


@pytest.mark.parametrize("name", ["tiny_mlp", "wide_mlp", "bert_mini"])
def test_torch_on_the_gpu_answers_as_on_the_cpu(
    name: str, example_repository: Path, build_models: ModuleType
) -> None:
    cpu = load(example_repository, name, None).instance()
    gpu = load(example_repository, name, 0).instance()
    entry = load_model(example_repository, name)
    rng = np.random.default_rng(5)
    inputs = {}
    for spec in entry.config.input:
        shape = (8, *(d if d > 0 else 16 for d in spec.dims))
        if spec.datatype == "INT64":
            inputs[spec.name] = rng.integers(0, 1000, shape, dtype=np.int64)
        else:
            inputs[spec.name] = rng.standard_normal(shape, dtype=np.float32)
    expected = cpu.infer(inputs)
    for _ in range(3):  # the pinned buffers are reused across batches
        got = gpu.infer(inputs)
        for output, array in expected.items():
            np.testing.assert_allclose(got[output], array, atol=FP32_TOLERANCE, rtol=1e-4)


def test_two_instances_on_a_device_hold_one_copy_of_the_weights(
    example_repository: Path,
) -> None:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    loaded = load(example_repository, "wide_mlp", 0, instances=2)
    first, second = loaded.instance(), loaded.instance()
    weights = sum(p.numel() * p.element_size() for p in loaded.module.parameters())
    held = torch.cuda.memory_allocated(0) - before
    assert weights <= held < 1.2 * weights, (weights, held)
    assert first.staging.stream != second.staging.stream  # a CUDA stream each

    rows = np.random.default_rng(1).standard_normal((64, 1024), dtype=np.float32)
    expected = load(example_repository, "wide_mlp", None).infer({"INPUT0": rows})["OUTPUT0"]
    results: dict[int, np.ndarray] = {}

    def run(index: int, instance: Any) -> None:
        for _ in range(20):
            results[index] = instance.infer({"INPUT0": rows})["OUTPUT0"]

    threads = [threading.Thread(target=run, args=(i, b)) for i, b in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index in (0, 1):  # side by side on their own streams, each still right
        np.testing.assert_allclose(results[index], expected, atol=FP32_TOLERANCE, rtol=1e-4)


def test_onnxruntime_cuda_answers_as_the_cpu(example_repository: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA provider (onnxruntime-gpu is not installed)")
    cpu = load(example_repository, "bert_mini_onnx", None)
    gpu = load(example_repository, "bert_mini_onnx", 0).instance()
    ids = np.random.default_rng(2).integers(0, 1000, (8, 128), dtype=np.int64)
    np.testing.assert_allclose(
        gpu.infer({"input_ids": ids})["logits"],
        cpu.infer({"input_ids": ids})["logits"],
        atol=FP32_TOLERANCE,
        rtol=1e-4,
    )


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_a_tensorrt_engine_answers_as_the_onnx_model(
    fp16: bool, example_repository: Path, tmp_path: Path
) -> None:
    pytest.importorskip("tensorrt")
    builder = _load_example("build_tensorrt")
    target = tmp_path / "tiny_mlp_trt"
    builder.main(
        ["--onnx", str(example_repository / "tiny_mlp_onnx"), "--out", str(target)]
        + (["--fp16"] if fp16 else [])
    )
    engine = load(tmp_path, "tiny_mlp_trt", 0, instances=2)
    first, second = engine.instance(), engine.instance()
    reference = load(example_repository, "tiny_mlp_onnx", None)
    tolerance = FP16_TOLERANCE if fp16 else FP32_TOLERANCE
    for rows in (1, 7, 64):  # dynamic shapes set per batch
        batch = np.random.default_rng(rows).standard_normal((rows, 64), dtype=np.float32)
        expected = reference.infer({"INPUT0": batch})["OUTPUT0"]
        for instance in (first, second):
            got = instance.infer({"INPUT0": batch})["OUTPUT0"]
            np.testing.assert_allclose(got, expected, atol=tolerance, rtol=tolerance)


def _load_example(name: str) -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"weir_examples_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the gpu pool in the mesh ---------------------------------------------------------------


def gpu_mesh(redis: RedisServer, repository: Path, tmp_path: Path, workers: int) -> Any:
    mesh = Topology(redis.url, repository, tmp_path, {"WEIR_WORKER_GPU_METRICS_INTERVAL_S": "0.5"})
    metrics_port = free_port()
    mesh.start("batcher", "batcher")
    for index in range(workers):
        mesh.start("gpu-worker", f"gpu-worker-{index}")
    port = free_port()
    mesh.start(
        "gateway",
        "gateway",
        WEIR_GATEWAY_HTTP_PORT=str(port),
        WEIR_GATEWAY_METRICS_PORT=str(metrics_port),
    )
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ready(f"{url}/v2/health/ready"), 120, "the gpu mesh")
    return mesh, url, f"http://127.0.0.1:{metrics_port}/metrics"


def gauge(metrics: str, name: str) -> list[float]:
    return [float(v) for v in re.findall(rf'^{name}\{{[^}}]*gpu_uuid="[^"]+"[^}}]*\}} (\S+)$',
                                         metrics, re.MULTILINE)]  # fmt: skip


@pytest.mark.timeout(300)
def test_the_gpu_pool_serves_bert_and_publishes_nvml_gauges_under_load(
    redis_server: RedisServer, example_repository: Path, build_models: ModuleType, tmp_path: Path
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["bert_mini"])
    on_gpu(repository, "bert_mini", count=2)
    mesh, url, metrics_url = gpu_mesh(redis_server, repository, tmp_path, workers=1)
    try:
        ids = np.random.default_rng(3).integers(0, 1000, (64, 128), dtype=np.int64)
        with torch.inference_mode():
            expected = build_models.reference_module("bert_mini")(torch.from_numpy(ids)).numpy()
        seen: dict[str, list[float]] = {}

        def scrape() -> bool:
            text = httpx.get(metrics_url, timeout=5).text
            for name in ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage"):
                seen[name] = gauge(text, name)
            return all(seen.values()) and max(seen["nv_gpu_utilization"]) > 0

        with httpx.Client(timeout=30) as client:
            stop = threading.Event()

            def load_on() -> None:
                while not stop.is_set():
                    _infer_bert(client, url, ids)

            loaders = [threading.Thread(target=load_on) for _ in range(8)]
            for thread in loaders:
                thread.start()
            try:
                wait_until(scrape, 60, f"non-zero NVML gauges under load ({seen})")
            finally:
                stop.set()
                for thread in loaders:
                    thread.join()
            np.testing.assert_allclose(
                _infer_bert(client, url, ids), expected, atol=FP32_TOLERANCE, rtol=1e-4
            )
        assert min(seen["nv_gpu_memory_used_bytes"]) > 0
        assert min(seen["nv_gpu_power_usage"]) > 0
    finally:
        mesh.stop_all()


def _infer_bert(client: httpx.Client, url: str, ids: np.ndarray) -> np.ndarray:
    body = {
        "inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": list(ids.shape),
             "data": ids.reshape(-1).tolist()}
        ]
    }  # fmt: skip
    response = client.post(f"{url}/v2/models/bert_mini/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


@pytest.mark.timeout(300)
def test_a_killed_gpu_worker_s_batches_are_run_by_the_survivor(
    redis_server: RedisServer, example_repository: Path, build_models: ModuleType, tmp_path: Path
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    on_gpu(repository, "tiny_mlp", count=1)
    mesh, url, _ = gpu_mesh(redis_server, repository, tmp_path, workers=2)
    rows = np.random.default_rng(7).standard_normal((256, 64), dtype=np.float32)
    with torch.inference_mode():
        expected = build_models.reference_module("tiny_mlp")(torch.from_numpy(rows)).numpy()
    try:

        async def run() -> list[Any]:
            stop = asyncio.Event()
            outcomes: list[Any] = []
            load = asyncio.create_task(
                closed_loop(lambda: [url], "tiny_mlp", rows, 64, stop, 4000, outcomes)
            )
            await asyncio.to_thread(wait_until, lambda: len(outcomes) > 500, 60, "load")
            mesh.by_name["gpu-worker-0"].send_signal(signal.SIGKILL)
            await asyncio.to_thread(wait_until, lambda: len(outcomes) > 2500, 120, "the rest")
            stop.set()
            await load
            return outcomes

        outcomes = asyncio.run(run())
    finally:
        mesh.stop_all()
    assert [(o.status, o.error) for o in outcomes if o.status != 200] == []
    for outcome in outcomes:
        np.testing.assert_allclose(outcome.output, expected[outcome.row], atol=FP32_TOLERANCE)
