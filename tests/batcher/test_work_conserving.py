"""Work-conserving batching: while a worker is idle a request never waits out the delay.

The model's ``max_queue_delay_microseconds`` is 3 s. With an idle worker the batcher sends
at once; with Triton's plain rule (work conserving off) a lone request waits the full delay.
With two batchers, each credit reaches one of them: the other still sends at once, having
asked Redis whether an instance is free (batcher.free_instance), instead of holding its
requests until its next upkeep gives it credits back (a second).
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

from tests.chaos.helpers import Topology, tiny_body
from tests.conftest import Mesh, private_redis, start_mesh, wait_until
from weir.redis_server import free_port

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


def timed_request(mesh: Mesh | str) -> float:
    url = mesh if isinstance(mesh, str) else mesh.url
    started = time.monotonic()
    body = tiny_body(np.ones(64, dtype=np.float32))
    response = httpx.post(f"{url}/v2/models/tiny_mlp/infer", json=body, timeout=30)
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


def test_with_two_batchers_an_idle_worker_still_gets_each_request_at_once(
    slow_delay_repository: Path, tmp_path: Path
) -> None:
    with private_redis("single") as server:
        topology = Topology(server.url, slow_delay_repository, tmp_path)
        try:
            url = topology.start_mesh(free_port())
            topology.start("batcher", "batcher-2")
            wait_until(
                lambda: all("other batchers share" in topology.log(name)
                            for name in ("batcher", "batcher-2")),
                30,
                "each batcher to see the other",
            )  # fmt: skip
            # Sequential requests: each finds the worker idle, and about half of them reach
            # the batcher without its credit. Before the probe those waited up to a second.
            elapsed = [timed_request(url) for _ in range(12)]
        finally:
            topology.stop_all()
    assert max(elapsed) < 0.5, elapsed
    assert sum(elapsed) < 1.5, elapsed
