"""Redis stopped and restarted under load: 503 only while it is down, correct answers after."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import pytest
import torch

from tests.chaos.helpers import Outcome, Topology, closed_loop, private_repository
from tests.conftest import wait_until
from weir.redis_server import RedisServer, free_port


def body(row: np.ndarray) -> dict[str, object]:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": row.tolist()}
    return {"inputs": [tensor]}


@pytest.mark.timeout(120)
def test_redis_outage_gives_503_only_while_down(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    rows = np.random.default_rng(5).standard_normal((64, 64), dtype=np.float32)
    with torch.inference_mode():
        expected = build_models.reference_module("tiny_mlp")(torch.from_numpy(rows)).numpy()
    port = free_port()
    server = RedisServer(appendonly=True).start()
    mesh = Topology(server.url, repository, tmp_path, {"WEIR_HEARTBEAT_TTL_S": "2"})
    try:
        url = mesh.start_mesh(port)
        window: dict[str, float] = {}

        outcomes: list[Outcome] = []

        def served_after(t: float) -> bool:
            return any(o.status == 200 and o.sent_s > t for o in list(outcomes))

        async def run() -> list[Outcome]:
            stop = asyncio.Event()
            load = asyncio.create_task(
                closed_loop(lambda: [url], "tiny_mlp", rows, 4, stop, 100_000, outcomes)
            )
            await asyncio.sleep(1.0)
            window["down"] = time.monotonic()
            await asyncio.to_thread(server.halt)
            # The load's clients may all be waiting on requests Redis took before it went;
            # a request that comes while it is down must be refused at once either way.
            sent_s = time.monotonic()
            probe = await asyncio.to_thread(httpx.post, f"{url}/v2/models/tiny_mlp/infer",
                                            json=body(rows[0]), timeout=10)  # fmt: skip
            window["probe"] = time.monotonic() - sent_s
            assert probe.status_code == 503, probe.text
            assert probe.headers["retry-after"] == "1"
            await asyncio.sleep(2.0)
            await asyncio.to_thread(server.start)
            window["up"] = time.monotonic()
            # Keep the load on until serving has resumed and run on for a while after.
            await asyncio.to_thread(wait_until, lambda: served_after(window["up"]), 30, "recovery")
            await asyncio.sleep(2.0)
            stop.set()
            return await load

        asyncio.run(run())
        print(f"redis outage: {len(outcomes)} sent, {sum(o.status == 200 for o in outcomes)} "
              f"answered 200, {sum(o.status == 503 for o in outcomes)} answered 503")  # fmt: skip
        failures = [(o.status, o.error) for o in outcomes if o.status not in (200, 503)]
        assert failures == []
        assert window["probe"] < 1.0, "a request during the outage waited for Redis"
        unavailable = [o for o in outcomes if o.status == 503]
        resumed = min(o.sent_s for o in outcomes if o.status == 200 and o.sent_s > window["up"])
        assert resumed - window["up"] < 15, "serving did not resume on its own in time"
        for outcome in unavailable:
            # Answered once Redis went away, and sent no later than service came back.
            assert window["down"] <= outcome.done_s and outcome.sent_s <= resumed, outcome.error
        after = [o for o in outcomes if o.sent_s > resumed + 0.5]
        assert len(after) > 20 and all(o.status == 200 for o in after)
        for outcome in (o for o in outcomes if o.status == 200):
            np.testing.assert_allclose(outcome.output, expected[outcome.row], atol=1e-5)
    finally:
        mesh.stop_all()
        server.stop()
