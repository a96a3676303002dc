"""Loading a model from files sent with the request (Triton's ``file:`` parameters).

The gateway and the worker here have uploads directories of their own, as on two hosts: the
worker serves the model from the files it fetched through Redis. Paths that leave the model
directory, files without a config and uploads over the limit are refused with the reason.
The files of an unloaded model leave both directories once their lease (here 2 s) runs out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.chaos.helpers import Topology
from tests.conftest import EXAMPLES, wait_until
from weir.redis_server import RedisServer, free_port

LIMIT_BYTES = 200_000
KEEP_S = 2.0
CONFIG = {
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
}


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, example_repository: Path
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("uploads")
    (root / "models").mkdir()
    with RedisServer() as server:
        topology = Topology(
            server.url,
            root / "models",
            root,
            {
                "WEIR_MODEL_CONTROL_MODE": "explicit",
                "WEIR_GATEWAY_MODEL_UPLOAD_LIMIT_BYTES": str(LIMIT_BYTES),
                "WEIR_UPLOADS_KEEP_S": str(KEEP_S),
            },
        )
        http_port, grpc_port = free_port(), free_port()
        topology.start("batcher", "batcher")
        topology.start("worker", "worker", WEIR_UPLOADS_DIR=str(root / "worker-files"))
        topology.start(
            "gateway",
            "gateway",
            WEIR_UPLOADS_DIR=str(root / "gateway-files"),
            WEIR_GATEWAY_HTTP_PORT=str(http_port),
            WEIR_GATEWAY_GRPC_PORT=str(grpc_port),
        )
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        wait_until(lambda: _ready(client), 60, "the gateway")
        try:
            yield {
                "root": root,
                "http": client,
                "grpc": f"127.0.0.1:{grpc_port}",
                "redis": server.url,
            }
        finally:
            client.close()
            topology.stop_all()


def _ready(client: httpclient.InferenceServerClient) -> bool:
    try:
        return bool(client.is_server_ready())
    except Exception:
        return False


def uploaded_keys(url: str) -> list[bytes]:
    with redis.Redis.from_url(url) as client:
        return list(client.scan_iter(match="weir:{control}:files:*"))


def onnx_bytes() -> bytes:
    return (EXAMPLES / "tiny_mlp_onnx" / "1" / "model.onnx").read_bytes()


def reference(x: np.ndarray, build_models: Any) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()


def test_a_model_sent_over_http_is_served_from_files_the_worker_fetched(
    mesh: dict[str, Any], build_models: Any
) -> None:
    client = mesh["http"]
    client.load_model("sent", config=json.dumps(CONFIG), files={"file:1/model.onnx": onnx_bytes()})
    x = np.random.default_rng(3).standard_normal((3, 64), dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [3, 64], "FP32")
    tensor.set_data_from_numpy(x)
    got = client.infer("sent", [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, reference(x, build_models), atol=1e-4)
    fetched = list((mesh["root"] / "worker-files").glob("*/sent/1/model.onnx"))
    assert [f.read_bytes() == onnx_bytes() for f in fetched] == [True]
    assert client.get_model_config("sent")["max_batch_size"] == 8


def test_a_model_sent_over_grpc_loads_and_unloads(mesh: dict[str, Any]) -> None:
    client = grpcclient.InferenceServerClient(mesh["grpc"])
    try:
        client.load_model(
            "sent_grpc", config=json.dumps(CONFIG), files={"file:1/model.onnx": onnx_bytes()}
        )
        assert client.is_model_ready("sent_grpc")
        kept = uploaded_keys(mesh["redis"])
        client.unload_model("sent_grpc")
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {"name": "sent_grpc", "state": "UNAVAILABLE", "reason": "unloaded"} in index
        assert len(uploaded_keys(mesh["redis"])) == len(kept) - 1  # its files went with it
        # ... and left each host's directory keep_s later; what is still loaded stays.
        for service in ("gateway", "worker"):
            files = mesh["root"] / f"{service}-files"
            wait_until(
                lambda files=files: not list(files.glob("*/sent_grpc")),
                30,
                f"the {service}'s copy of the unloaded model's files to go",
            )
            loaded = {m["name"] for m in index if m.get("state") == "READY"}
            assert {p.name for p in files.glob("*/*")} == loaded & {"sent"}
    finally:
        client.close()


@pytest.mark.parametrize(
    ("config", "files", "message"),
    [
        (CONFIG, {"file:../escape/model.onnx": b"x"}, "must be a path inside the model directory"),
        (None, {"file:1/model.onnx": b"x"}, "the model config ('config') must come with its files"),
        (
            CONFIG,
            {"file:1/model.onnx": bytes(LIMIT_BYTES + 1)},
            f"exceed the limit of {LIMIT_BYTES}",
        ),
        (CONFIG, {"file:config.pbtxt": b"x"}, "no file in a version directory"),
        (CONFIG, {"file:1/model.onnx": b"not onnx"}, "not a valid ONNX model"),
    ],
)
def test_bad_uploads_are_refused_with_the_reason(
    mesh: dict[str, Any], config: dict[str, Any] | None, files: dict[str, bytes], message: str
) -> None:
    kept = uploaded_keys(mesh["redis"])
    with pytest.raises(InferenceServerException) as caught:
        mesh["http"].load_model(
            "refused", config=json.dumps(config) if config else None, files=files
        )
    assert caught.value.status() == "400"
    assert message in caught.value.message()
    assert "failed to load 'refused'" in caught.value.message()
    assert uploaded_keys(mesh["redis"]) == kept  # a refused load leaves no files in Redis
