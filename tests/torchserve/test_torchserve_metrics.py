"""TorchServe's metric names on a real mesh's metrics port, for a gateway of one process and
of two (prometheus-client's multi-process files), as a TorchServe dashboard would scrape them:
``?name[]=`` filters, TorchServe's labels, and exact counts of the traffic sent."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Mesh, wait_until
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import register, store_mesh
from tests.torchserve.test_metric_names import parsed

TOKEN = "watch-me"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ECHO = """
def handle(data, context):
    return [str(row.get("body") or row.get("data")) for row in data] if data else None
"""
NAMES = (
    "ts_inference_requests_total",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
    "Requests2XX",
    "Requests4XX",
    "Requests5XX",
)


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-processes"])
def ts_mesh(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Mesh, str]]:
    tmp_path = tmp_path_factory.mktemp("ts-metrics")
    store = tmp_path / "store"
    store.mkdir()
    build_archive(store, "echo", ECHO, version="3.1")
    (tmp_path / "repository").mkdir()
    env = {"WEIR_GATEWAY_PROCESSES": request.param, "WEIR_CONTROL_REFRESH_S": "0.2"}
    with store_mesh(store, tmp_path / "repository", TOKEN, **env) as (mesh, management):
        registered = register(management, TOKEN, "echo.mar")
        assert registered.status_code == 200, registered.text
        yield mesh, management


def scrape(mesh: Mesh, names: tuple[str, ...] = NAMES) -> tuple[str, dict]:
    query = "&".join(f"name[]={name}" for name in names)
    response = httpx.get(f"{mesh.metrics_url}?{query}", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response.text, parsed(response.text)


FLUSH_S = 0.25  # WEIR_GATEWAY_METRICS_FLUSH_S's default


def settled(mesh: Mesh) -> dict:
    """A scrape no flush still to come will change: alike twice, further apart than a flush.

    A multi-process gateway's processes hand their counts on every flush_s, so a scrape
    just after traffic (the fixture's registration too) may not show all of it yet.
    """
    _, last = scrape(mesh)
    for _ in range(20):
        time.sleep(2 * FLUSH_S)
        _, now = scrape(mesh)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the traffic counters kept changing: {last}")


def test_torchserve_series_count_the_traffic(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh
    model = (("hostname", socket.gethostname()), ("model_name", "echo"), ("model_version", "3.1"))
    host = (("Hostname", socket.gethostname()), ("Level", "Host"))
    before = settled(mesh)

    for i in range(12):  # a connection each, so a two-process gateway shares them out
        answer = httpx.post(f"{mesh.url}/predictions/echo", content=f"row {i}", timeout=30)
        assert answer.status_code == 200, answer.text
    assert httpx.post(f"{mesh.url}/predictions/nobody", content=b"x").status_code == 404
    assert httpx.get(f"{management}/models/nobody", headers=AUTH).status_code == 404
    assert httpx.post(f"{mesh.url}/v2/models/echo/infer", content=b"{").status_code == 400
    text, after = "", {}

    def grew(name: str, labels: tuple[tuple[str, str], ...]) -> float:
        assert (name, labels) in after, text
        return after[name, labels] - before.get((name, labels), 0.0)

    def counted() -> bool:  # each process of a multi-process gateway hands its counts on
        nonlocal text, after  # every metrics_flush_s
        text, after = scrape(mesh)
        requests, ok = ("ts_inference_requests_total", model), ("Requests2XX", host)
        return requests in after and ok in after and grew(*requests) >= 13 and grew(*ok) >= 12

    wait_until(counted, 10, "the traffic in the metrics")
    after = settled(mesh)  # nothing more than the traffic arrives later

    assert grew("ts_inference_requests_total", model) == 13  # the malformed one answered too
    assert grew("ts_inference_latency_microseconds", model) > 0
    assert grew("ts_queue_latency_microseconds", model) > 0
    assert (
        after["ts_queue_latency_microseconds", model]
        < after["ts_inference_latency_microseconds", model]
    )
    assert grew("Requests2XX", host) == 12
    assert grew("Requests4XX", host) == 3
    assert grew("Requests5XX", host) == 0
    assert "# TYPE ts_inference_latency_microseconds counter" in text
    # Only what name[] asked for.
    assert {name for name, _ in after} == set(NAMES)
    assert not re.search(r"^weir_", text, re.MULTILINE)


def test_the_whole_page_serves_weirs_names_and_torchserves(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, _ = ts_mesh
    answer = httpx.post(f"{mesh.url}/predictions/echo", content=b"one", timeout=30)
    assert answer.status_code == 200, answer.text
    names: set[str] = set()
    wanted = (*NAMES, "weir_inference_request_success_total", "weir_http_responses_total")

    def served() -> bool:  # a multi-process gateway's counts come with its next flush
        response = httpx.get(mesh.metrics_url, headers=AUTH, timeout=30)
        names.update(name for name, _ in parsed(response.text))
        return all(name in names for name in wanted)

    wait_until(served, 10, "every series in the metrics")
    for gauge in ("CPUUtilization", "MemoryUsed", "MemoryAvailable", "DiskAvailable"):
        assert gauge in names
