"""A model's ``load_timeout_s``: a load that never ends is reported failed, its worker replaced.

``weir up`` in mode explicit starts with two models: ``sleeper``, which loads, and
``hanger``, whose ``initialize`` waits for something that never comes and which may take
2 s to load. The start load is reported failed with the limit in its reason; the worker that
tried exits and a fresh one takes its place, which serves ``sleeper`` and reports the failure
again without trying the same load (``initialize`` ran once). A load asked again is a new
attempt: it is tried, refused with the same reason, and the worker is replaced again; a
request queued meanwhile is answered as soon as that attempt fails.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from tests.conftest import free_port, wait_until
from tests.sleeper import ECHO, write_sleeper
from tests.weir_up import weir_up
from weir import names

HANGER = """
import threading


class Hangs:
    def initialize(self, context):
        with open(context.parameters["attempts"], "a") as attempts:
            attempts.write("initialize\\n")
        threading.Event().wait()  # a license server that never answers, say

    def inference(self, batch):
        return {"Y": batch["X"]}
"""
TIMEOUT_S = 2
REASON = f"did not finish loading within its load timeout ({TIMEOUT_S} s)"


def write_hanger(repository: Path, attempts: Path) -> None:
    version = repository / "hanger" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(HANGER)
    config = yaml.safe_load((repository / "sleeper" / "config.yaml").read_text())
    config["name"] = "hanger"
    config["parameters"] = {"load_timeout_s": str(TIMEOUT_S), "attempts": str(attempts)}
    (repository / "hanger" / "config.yaml").write_text(yaml.safe_dump(config))


def write_pipeline(repository: Path) -> None:
    """``through``: a pipeline of one step, hanger."""
    tensor = {"data_type": "TYPE_FP32", "dims": [1]}
    steps = [{"model_name": "hanger", "input_map": {"X": "X"}, "output_map": {"Y": "Y"}}]
    config = {
        "name": "through",
        "platform": "ensemble",
        "max_batch_size": 1,
        "input": [{"name": "X", **tensor}],
        "output": [{"name": "Y", **tensor}],
        "ensemble_scheduling": {"step": steps},
    }
    (repository / "through").mkdir()
    (repository / "through" / "config.yaml").write_text(yaml.safe_dump(config))


def reported_by_a_live_worker(client: redis.Redis, text: bytes) -> bool:
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    live = client.zrangebyscore(names.live_expiry(names.WORKER_GROUP), f"({now_ms}", "+inf")
    values = client.hmget(names.live_values(names.WORKER_GROUP), live) if live else []
    return any(value and text in value for value in values)


BODY = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [3]}]}


def served(port: int) -> bool:
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/v2/models/sleeper/infer", json=BODY)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json()["outputs"][0]["data"] == [3]


def refused_at_once(port: int) -> bool:
    """A request for the model that failed to load is refused, not queued for nobody."""
    url = f"http://127.0.0.1:{port}/v2/models/hanger/infer"
    try:
        answer = httpx.post(url, json=BODY, timeout=2)
    except httpx.TimeoutException:  # queued: the gateway has not seen the failure yet
        return False
    if answer.status_code != 503:
        return False
    assert (
        answer.json()["error"]
        == f"'hanger' version 1 is not at ready state (load failed: {REASON})"
    )
    return True


@pytest.mark.timeout(180)
def test_a_load_past_its_timeout_is_reported_and_its_worker_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models, attempts = tmp_path / "models", tmp_path / "attempts"
    write_sleeper(models, ECHO)
    write_hanger(models, attempts)
    write_pipeline(models)
    monkeypatch.setenv("WEIR_HEARTBEAT_TTL_S", "1")
    http_port, redis_port = free_port(), free_port()
    args = ["--repository", str(models), "--http-port", str(http_port), "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--redis-port", str(redis_port)]
    args += ["--model-control-mode", "explicit", "--load-model", "sleeper,hanger,through"]
    with weir_up(*args), redis.Redis(port=redis_port) as client:
        url = f"http://127.0.0.1:{http_port}/v2"
        wait_until(lambda: served(http_port), 60, "sleeper to be served")
        # The fresh worker reports the failure it found recorded, and did not load again.
        wait_until(lambda: reported_by_a_live_worker(client, REASON.encode()), 30, "the report")
        assert attempts.read_text().splitlines() == ["initialize"]
        index = httpx.post(f"{url}/repository/index").json()
        (hanger,) = [m for m in index if m["name"] == "hanger"]
        assert hanger["state"] == "UNAVAILABLE" and REASON in hanger["reason"], index
        wait_until(lambda: refused_at_once(http_port), 10, "requests for hanger to be refused")
        # So is a pipeline that runs it.
        piped = httpx.post(f"{url}/models/through/infer", json=BODY, timeout=10)
        assert piped.status_code == 503, piped.text
        assert piped.json()["error"] == (
            "'through' version 1 is not at ready state (step 0 (model 'hanger' version 1) "
            f"failed to load: {REASON})"
        )

        started = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(httpx.post, f"{url}/repository/models/hanger/load", timeout=60)
            # Asked again, hanger is a new attempt, not failed yet: once a worker tries it, a
            # request is queued. It is answered once the attempt fails, not when its
            # deadline (60 s) passes.
            tried = lambda: len(attempts.read_text().splitlines()) == 2  # noqa: E731
            wait_until(tried, 10, "the new attempt")
            queued = httpx.post(f"{url}/models/hanger/infer", json=BODY, timeout=60)
            assert queued.status_code == 503, queued.text
            assert REASON in queued.json()["error"]
            assert time.monotonic() - started < TIMEOUT_S + 20
            again = load.result()
        assert again.status_code == 400, again.text
        assert again.json()["error"] == f"failed to load 'hanger': {REASON}"
        assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 20
        assert attempts.read_text().splitlines() == ["initialize"] * 2  # a new attempt
        # That worker exits too; a fresh one serves what it served.
        wait_until(lambda: served(http_port), 60, "sleeper to be served again")
        ready = httpx.post(f"{url}/repository/index", json={"ready": True}).json()
        assert [m["name"] for m in ready] == ["sleeper"]
        # The failed load was undone (hanger back at its earlier attempt, which timed out
        # too): the fresh worker reports that, and does not try either attempt again.
        wait_until(lambda: reported_by_a_live_worker(client, REASON.encode()), 30, "the report")
        time.sleep(TIMEOUT_S + 1)  # an absence: as long as a wrongful attempt would take to show
        assert attempts.read_text().splitlines() == ["initialize"] * 2
