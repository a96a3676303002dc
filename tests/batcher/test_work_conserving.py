"""Work-conserving batching: while a worker is idle a request never waits out the delay.

The model's ``max_queue_delay_microseconds`` is 3 s. With an idle worker the batcher sends
at once; with Triton's plain rule (work conserving off) a lone request waits the full delay.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest
import yaml

from tests.chaos.helpers import tiny_body
from tests.conftest import Mesh, private_redis, start_mesh

DELAY_S = 3.0


@pytest.fixture(scope="module")
def slow_delay_repository(
    tmp_path_factory: pytest.TempPathFactory, build_models: ModuleType
) -> Path:
    root = tmp_path_factory.mktemp("delay-models")
    build_models.build_model(root, "tiny_mlp")
    config_path = root / "tiny_mlp" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["dynamic_batching"] = {"max_queue_delay_microseconds": int(DELAY_S * 1e6)}
    config_path.write_text(yaml.safe_dump(config))
    return root


def mesh_with(repository: Path, work_conserving: bool, kind: str = "single") -> Iterator[Mesh]:
    with private_redis(kind) as server:
        env = {"WEIR_BATCHER_WORK_CONSERVING": str(work_conserving).lower()}
        mesh = start_mesh(server.url, repository, env)
        try:
            yield mesh
        finally:
            mesh.stop()


def timed_request(mesh: Mesh) -> float:
    started = time.monotonic()
    body = tiny_body(np.ones(64, dtype=np.float32))
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_an_idle_worker_gets_each_request_at_once(kind: str, slow_delay_repository: Path) -> None:
    for mesh in mesh_with(slow_delay_repository, work_conserving=True, kind=kind):
        elapsed = [timed_request(mesh) for _ in range(5)]
        assert max(elapsed) < DELAY_S / 2, elapsed


def test_the_plain_rule_makes_a_lone_request_wait_out_the_delay(
    slow_delay_repository: Path,
) -> None:
    for mesh in mesh_with(slow_delay_repository, work_conserving=False):
        assert timed_request(mesh) >= DELAY_S * 0.9
