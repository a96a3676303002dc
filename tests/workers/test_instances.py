"""A worker loads a torch model once for all its instances, a Python handler once per instance."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch
import yaml

from weir.redis_server import RedisServer
from weir.settings import WorkerSettings
from workers.service import Worker

HANDLER = """
class Echo:
    def initialize(self, context):
        pass

    def preprocess(self, batch):
        return batch["X"]

    def inference(self, x):
        return x

    def postprocess(self, x):
        return {"Y": x}
"""


def write_config(model_dir: Path, backend: str, count: int) -> None:
    config = {
        "name": model_dir.name,
        "backend": backend,
        "max_batch_size": 4,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
        "instance_group": [{"kind": "KIND_CPU", "count": count}],
    }
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config))


async def test_torch_instances_share_their_weights_python_ones_do_not(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    torch_dir = tmp_path / "linear"
    (torch_dir / "1").mkdir(parents=True)
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(torch_dir / "1" / "model.pt"))
    write_config(torch_dir, "pytorch", 3)
    python_dir = tmp_path / "echo"
    (python_dir / "1").mkdir(parents=True)
    (python_dir / "1" / "model.py").write_text(textwrap.dedent(HANDLER))
    write_config(python_dir, "python", 2)

    worker = Worker(WorkerSettings(redis_url=redis_server.url, repository=tmp_path))
    await worker.startup()
    try:
        lanes = {lane.entry.name: lane for lane in worker.lanes}
        linear = [runner.backend for runner in lanes["linear"].runners]
        echo = [runner.backend for runner in lanes["echo"].runners]
        assert len(linear) == 3 and all(b is linear[0] for b in linear)
        assert len(echo) == 2 and echo[0] is not echo[1]
        # Every torch model shares out the worker's one set of threads.
        assert linear[0].share is worker.threads  # type: ignore[attr-defined]
    finally:
        await worker.shutdown()
