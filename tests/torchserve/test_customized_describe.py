"""What TorchServe describes: a handler's ``describe_handle``, and the APIs themselves.

``weir up`` serves an archive whose handler is TorchServe's own ``BaseHandler`` with a
``describe_handle`` of its own, over a scripted model. ``GET /models/{m}?customized=true``
carries what it returns as ``customizedMetadata``, as TorchServe's does; ``all`` and a plain
describe do not ask the handler. ``OPTIONS /`` and ``GET /api-description`` describe each
port's API.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import torch

from tests.conftest import free_port
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up

DESCRIBED = """
from ts.torch_handler.base_handler import BaseHandler


class Described(BaseHandler):
    def describe_handle(self):
        return {"classes": ["cat", "dog"], "input": "4 floats"}
"""


def test_customized_describe_asks_the_handler(tmp_path: Path) -> None:
    store = tmp_path / "model-store"
    torch.jit.script(torch.nn.Linear(4, 2).eval()).save(str(tmp_path / "linear.pt"))
    build_archive(store, "described", DESCRIBED, serialized_file=tmp_path / "linear.pt")
    config = write_ts_config(tmp_path, store)
    args = ["--ts-config", str(config.path), "--models", "described.mar", "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--redis-port", str(free_port())]
    with weir_up(*args):
        url = f"http://127.0.0.1:{config.management_port}/models/described"
        (described,) = httpx.get(url, params={"customized": "true"}, timeout=30).json()
        assert described["modelName"] == "described"
        assert described["customizedMetadata"] == {"classes": ["cat", "dog"], "input": "4 floats"}
        (plain,) = httpx.get(url, timeout=30).json()
        assert "customizedMetadata" not in plain
        every = httpx.get(f"{url}/all", params={"customized": "true"}, timeout=30).json()
        assert ["customizedMetadata" in v for v in every] == [False]


def test_the_api_description_on_both_ports(tmp_path: Path) -> None:
    store = tmp_path / "model-store"
    store.mkdir()
    config = write_ts_config(tmp_path, store)
    args = ["--ts-config", str(config.path), "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--redis-port", str(free_port())]
    with weir_up(*args):
        for port in (config.http_port, config.management_port):
            options = httpx.options(f"http://127.0.0.1:{port}/", timeout=30)
            assert options.status_code == 200
            assert options.json() == httpx.get(f"http://127.0.0.1:{port}/api-description").json()
        inference = httpx.get(f"http://127.0.0.1:{config.http_port}/api-description").json()
        assert "/predictions/{model}" in inference["paths"]
        assert "/v2/models/{model}/infer" in inference["paths"]
        management = httpx.get(f"http://127.0.0.1:{config.management_port}/api-description")
        paths = management.json()["paths"]
        assert set(paths["/models"]) == {"get", "post"}
        assert set(paths["/models/{model}"]) == {"get", "put", "delete"}
        assert "/predictions/{model}" not in paths
