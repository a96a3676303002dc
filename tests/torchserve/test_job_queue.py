"""TorchServe's job queue and client timeout: what a model queues, and for how long.

``weir up`` serves archives whose handler takes a second, with ``config.properties``'
``job_queue_size=2``: ``slow``; ``roomy``, whose ``model-config.yaml`` sets its own
``jobQueueSize``; ``hasty``, whose ``clientTimeoutInMills`` is 300. Five requests to
``slow`` at once: two are taken, three are refused at once with a 503 that says why, in
TorchServe's error shape; a request to ``hasty`` is answered with a 504 after 0.3 s.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.conftest import free_port
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up
from weir.repository import load_model

SLOW = """
import time


def handle(data, context):
    if data is None:
        return None
    time.sleep(1)
    return ["done"] * len(data)
"""


def test_a_model_queues_at_most_its_job_queue_size(tmp_path: Path) -> None:
    store = tmp_path / "model-store"
    build_archive(store, "slow", SLOW)
    build_archive(store, "roomy", SLOW, config_yaml="jobQueueSize: 7\n")
    build_archive(store, "hasty", SLOW, config_yaml="clientTimeoutInMills: 300\n")
    config = write_ts_config(tmp_path, store, "job_queue_size=2")
    args = ["--ts-config", str(config.path), "--models", "slow.mar", "roomy.mar", "hasty.mar"]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]
    with weir_up(*args):
        repository = store / ".weir"
        for name, size in (("slow", 2), ("roomy", 7)):
            batching = load_model(repository, name).config.dynamic_batching
            assert batching is not None
            assert batching.default_queue_policy.max_queue_size == size

        management = f"http://127.0.0.1:{config.management_port}"
        (described,) = httpx.get(f"{management}/models/roomy").json()
        assert described["jobQueueStatus"] == {"remainingCapacity": 7, "pendingRequests": 0}
        inference = f"http://127.0.0.1:{config.http_port}/predictions"
        started = time.monotonic()
        late = httpx.post(f"{inference}/hasty", content=b"x", timeout=30)
        # Its client timeout: answered when it passes (TorchServe drops the answer).
        assert time.monotonic() - started < 0.9
        assert late.status_code == 504
        assert late.json()["message"] == (
            "Request timeout expired: model 'hasty' version '1' did not answer within 0.3 s"
        )
        url = f"{inference}/slow"
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda _: httpx.post(url, content=b"x", timeout=30), range(5)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(200) >= 2 and 503 in statuses, statuses
        refused = next(a for a in answers if a.status_code == 503).json()
        assert refused["code"] == 503
        assert refused["type"] == "ServiceUnavailableException"
        assert "'slow'" in refused["message"] and "queue" in refused["message"], refused
