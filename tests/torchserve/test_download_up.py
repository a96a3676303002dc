"""Archives by URL through ``weir up``: ``--models URL`` and the management API, as TorchServe.

A real HTTP server on 127.0.0.1 holds the archives; ``config.properties``' ``allowed_urls``
lets ``weir up`` fetch from it only. The start archive is fetched and served, another is
registered by URL, listed by it, served, and removed from the store when unregistered; a
URL no pattern allows gets TorchServe's 404.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.conftest import free_port
from tests.torchserve.archives import build_archive
from tests.torchserve.http_files import serving
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up

ECHO = """
def handle(data, context):
    if data is None:
        return None
    name = context.manifest["model"]["modelName"]
    return [{"model": name, "got": bytes(row["body"]).decode()} for row in data]
"""


def test_archives_are_fetched_by_url_and_served(tmp_path: Path) -> None:
    served, store = tmp_path / "served", tmp_path / "model-store"
    build_archive(served, "echo", ECHO)
    build_archive(served, "other", ECHO)
    store.mkdir()
    with serving(served) as server:
        config = write_ts_config(tmp_path, store, f"allowed_urls={re.escape(server)}/.*\\.mar")
        http_port, management_port = config.http_port, config.management_port
        args = ["--ts-config", str(config.path), "--models", f"{server}/echo.mar"]
        args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]
        with weir_up(*args):
            inference, management = (
                f"http://127.0.0.1:{http_port}",
                f"http://127.0.0.1:{management_port}",
            )
            answer = httpx.post(f"{inference}/predictions/echo", content=b"hi", timeout=30)
            assert answer.json() == {"model": "echo", "got": "hi"}

            query = {"url": f"{server}/other.mar", "synchronous": "true", "initial_workers": 1}
            registered = httpx.post(f"{management}/models", params=query, timeout=120)
            assert registered.status_code == 200, registered.text
            listed = httpx.get(f"{management}/models").json()["models"]
            assert {"modelName": "other", "modelUrl": f"{server}/other.mar"} in listed
            answer = httpx.post(f"{inference}/predictions/other", content=b"yo", timeout=30)
            assert answer.json() == {"model": "other", "got": "yo"}
            assert sorted(p.name for p in store.glob("*.mar")) == ["echo.mar", "other.mar"]

            assert httpx.delete(f"{management}/models/other", timeout=60).status_code == 200
            assert sorted(p.name for p in store.glob("*.mar")) == ["echo.mar"]

            refused = httpx.post(
                f"{management}/models", params={"url": "http://localhost:1/x.mar"}, timeout=30
            )
            assert refused.status_code == 404
            assert refused.json()["message"] == (
                "Given URL http://localhost:1/x.mar does not match any allowed URL(s)"
            )
