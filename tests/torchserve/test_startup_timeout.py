"""TorchServe's ``startupTimeout``: an archive whose ``initialize`` never ends is given up on.

``weir up`` starts with two archives: ``echo``, and ``hanger``, whose ``model-config.yaml``
sets ``startupTimeout: 2`` and whose ``initialize`` waits for something that never comes.
The start archive stays registered without workers while ``echo`` is served; registering the
same archive again, synchronously, answers TorchServe's 500 with the reason and is undone,
and the other models go on being served by the fresh worker that replaces the stuck one.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.conftest import free_port, wait_until
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up

ECHO = """
def handle(data, context):
    if data is None:
        return None
    return [{"got": bytes(row["body"]).decode()} for row in data]
"""
HANGER = """
import threading


class Hangs:
    def initialize(self, context):
        threading.Event().wait()  # a license server that never answers, say

    def handle(self, data, context):
        return data
"""
TIMEOUT_S = 2
REASON = f"did not finish loading within its load timeout ({TIMEOUT_S} s)"


def served(port: int) -> bool:
    try:
        response = httpx.post(f"http://127.0.0.1:{port}/predictions/echo", content=b"hi")
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and response.json() == {"got": "hi"}


def test_an_archive_past_its_startup_timeout_is_reported_and_not_served(
    tmp_path: Path,
) -> None:
    store = tmp_path / "model-store"
    build_archive(store, "echo", ECHO)
    build_archive(store, "hanger", HANGER, config_yaml=f"startupTimeout: {TIMEOUT_S}\n")
    config = write_ts_config(tmp_path, store)
    http_port, management = config.http_port, f"http://127.0.0.1:{config.management_port}"
    models = "echo=echo.mar,hanger=hanger.mar"
    args = ["--ts-config", str(config.path), "--models", *models.split(","), "--grpc-port", "0"]
    args += ["--ncs", "--disable-token-auth"]  # torchserve's flags, taken as they are
    with weir_up(*args, "--redis-port", str(free_port())):
        wait_until(lambda: served(http_port), 60, "echo served")
        (described,) = httpx.get(f"{management}/models/hanger").json()
        assert described["startupTimeout"] == TIMEOUT_S
        # Registered, but no worker serves it; asked for, it is refused at once.
        assert described["workers"] == []
        refused = httpx.post(f"http://127.0.0.1:{http_port}/predictions/hanger", content=b"x")
        assert refused.status_code == 503, refused.text
        assert REASON in refused.json()["message"]

        started = time.monotonic()
        again = httpx.post(
            f"{management}/models",
            params={"url": "hanger.mar", "model_name": "late", "synchronous": "true"},
            timeout=120,
        )
        assert again.status_code == 500, again.text
        assert again.json()["code"] == 500
        assert REASON in again.json()["message"]
        assert time.monotonic() - started < TIMEOUT_S + 30
        # Undone, as a registration whose handler fails to load is.
        assert httpx.get(f"{management}/models/late").status_code == 404
        # The stuck worker was replaced; the fresh one serves echo.
        wait_until(lambda: served(http_port), 60, "echo served")
