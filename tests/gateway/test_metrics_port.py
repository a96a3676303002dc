"""The metrics port and the API description take the management token when one is set, and
a flood of scrapes is answered cheaply (shared renders, bounded at once) while inference goes on."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Mesh, private_mesh

TOKEN = "scrape-me"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def guarded(tiny_repository: Path) -> Iterator[Mesh]:
    env = {"WEIR_GATEWAY_MANAGEMENT_TOKEN": TOKEN, "WEIR_GATEWAY_METRICS_MAX_SCRAPES": "2"}
    with private_mesh(tiny_repository, env) as mesh:
        yield mesh


def test_metrics_take_the_management_token(guarded: Mesh) -> None:
    assert httpx.get(guarded.metrics_url).status_code == 401
    wrong = httpx.get(guarded.metrics_url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    scraped = httpx.get(guarded.metrics_url, headers=AUTH)
    assert scraped.status_code == 200
    assert "weir_inference_request_success_total" in scraped.text


def test_the_api_description_takes_the_management_token(guarded: Mesh) -> None:
    assert httpx.get(f"{guarded.url}/openapi.json").status_code == 401
    assert httpx.get(f"{guarded.url}/docs").status_code == 401
    described = httpx.get(f"{guarded.url}/openapi.json", headers=AUTH)
    assert described.status_code == 200
    assert "/v2/models/{model}/infer" in described.json()["paths"]
    assert httpx.get(f"{guarded.url}/docs", headers=AUTH).status_code == 200
    assert httpx.get(f"{guarded.url}/v2/health/ready").status_code == 200  # probes stay open


FLOOD = """
import sys
from concurrent.futures import ThreadPoolExecutor
import httpx

url, token, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

def scrape(_):
    try:
        return httpx.get(url, headers={"Authorization": "Bearer " + token}, timeout=30).status_code
    except httpx.TransportError:
        return 0  # closed unanswered: more connections than the port serves at once

with ThreadPoolExecutor(64) as pool:
    print(sorted(set(pool.map(scrape, range(count)))))
"""


def test_a_flood_of_scrapes_is_bounded_and_inference_goes_on(guarded: Mesh) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]
    }
    flood = subprocess.Popen(
        [sys.executable, "-c", FLOOD, guarded.metrics_url, TOKEN, "300"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        slowest_s = 0.0
        while flood.poll() is None:
            started = time.monotonic()
            response = httpx.post(f"{guarded.url}/v2/models/tiny_mlp/infer", json=body, timeout=30)
            assert response.status_code == 200
            slowest_s = max(slowest_s, time.monotonic() - started)
        printed, _ = flood.communicate()
        statuses = set(ast.literal_eval(printed))
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.communicate()
    # The flood's own 64 threads share this machine's cores; inference slows, never stops.
    assert slowest_s < 3.0
    assert statuses <= {200, 503, 0}
    assert 200 in statuses
