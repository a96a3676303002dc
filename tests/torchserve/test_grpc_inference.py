"""TorchServe's gRPC inference API through ``weir up``, called as TorchServe's clients call it.

The calls are made with a real gRPC channel on the port ``config.properties``'
``grpc_inference_port`` names, by method path and serialized messages of TorchServe's
``inference.proto`` (package ``org.pytorch.serve.grpc.inference``), which is what stubs
generated from that file send.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2

from gateway.torchserve import grpc_management
from gateway.torchserve.grpc_inference import (
    SERVICE,
    PredictionResponse,
    PredictionsRequest,
    TorchServeHealthResponse,
)
from tests.conftest import free_port
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up

ECHO = """
import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        fields = {k: bytes(v).decode() for k, v in row.items()}
        answers.append(json.dumps({"fields": fields, "model": context.model_name}))
    return answers
"""


TOKEN = "let-me-in"
AUTHORIZED = (("authorization", f"Bearer {TOKEN}"),)


def call(
    channel: grpc.Channel,
    method: str,
    request: bytes,
    stream: bool = False,
    metadata: tuple[tuple[str, str], ...] = AUTHORIZED,
) -> bytes:
    path = f"/{SERVICE}/{method}"
    if stream:
        (only,) = list(channel.unary_stream(path)(request, timeout=30, metadata=metadata))
        return bytes(only)
    return bytes(channel.unary_unary(path)(request, timeout=30, metadata=metadata))


def test_pings_and_predictions_answer_as_torchserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_GATEWAY_INFERENCE_TOKEN", TOKEN)
    store = tmp_path / "model-store"
    build_archive(store, "echo", ECHO)
    config = write_ts_config(tmp_path, store)
    args = ["--ts-config", str(config.path), "--models", "echo.mar", "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--redis-port", str(free_port())]
    with (
        weir_up(*args),
        grpc.insecure_channel(f"127.0.0.1:{config.grpc_inference_port}") as channel,
    ):
        pong = TorchServeHealthResponse.FromString(
            call(channel, "Ping", empty_pb2.Empty().SerializeToString())
        )
        assert json.loads(pong.health)["status"] == "Healthy"

        asked = PredictionsRequest(model_name="echo", input={"data": b"hello", "tag": b"t1"})
        for stream in (False, True):
            answer = PredictionResponse.FromString(
                call(channel, "Predictions" if not stream else "StreamPredictions",
                     asked.SerializeToString(), stream)
            )  # fmt: skip
            assert json.loads(answer.prediction) == {
                "fields": {"data": "hello", "tag": "t1"},
                "model": "echo",
            }

        with pytest.raises(grpc.RpcError) as unauthorized:
            call(channel, "Predictions", asked.SerializeToString(), metadata=())
        assert unauthorized.value.code() == grpc.StatusCode.UNAUTHENTICATED

        unknown = PredictionsRequest(model_name="absent", input={"data": b"x"})
        with pytest.raises(grpc.RpcError) as refused:
            call(channel, "Predictions", unknown.SerializeToString())
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert "absent" in (refused.value.details() or "")


def manage(channel: grpc.Channel, method: str, message: str, **fields: object) -> str:
    request = grpc_management.MESSAGES[message](**fields).SerializeToString()
    answer = channel.unary_unary(f"/{grpc_management.SERVICE}/{method}")(request, timeout=120)
    return str(grpc_management.ManagementResponse.FromString(answer).msg)


def test_the_management_api_over_grpc(tmp_path: Path) -> None:
    store = tmp_path / "model-store"
    build_archive(store, "echo", ECHO)
    build_archive(store, "other", ECHO)
    config = write_ts_config(tmp_path, store)
    args = ["--ts-config", str(config.path), "--models", "echo.mar", "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--redis-port", str(free_port())]
    address = f"127.0.0.1:{config.grpc_management_port}"
    with weir_up(*args), grpc.insecure_channel(address) as channel:
        listed = json.loads(manage(channel, "ListModels", "ListModelsRequest"))
        assert listed == {"models": [{"modelName": "echo", "modelUrl": "echo.mar"}]}

        registered = manage(
            channel, "RegisterModel", "RegisterModelRequest",
            url="other.mar", initial_workers=1, synchronous=True, batch_size=4,
        )  # fmt: skip
        assert registered == 'Model "other" Version: 1.0 registered with 1 initial workers'
        (described,) = json.loads(
            manage(channel, "DescribeModel", "DescribeModelRequest", model_name="other")
        )
        assert (described["batchSize"], len(described["workers"])) == (4, 1)
        scaled = manage(
            channel, "ScaleWorker", "ScaleWorkerRequest",
            model_name="other", min_worker=2, synchronous=True,
        )  # fmt: skip
        assert scaled == "Workers scaled to 2 for model: other"
        assert (
            manage(channel, "UnregisterModel", "UnregisterModelRequest", model_name="other")
            == 'Model "other" unregistered'
        )

        with pytest.raises(grpc.RpcError) as missing:
            manage(channel, "DescribeModel", "DescribeModelRequest", model_name="absent")
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "absent" in (missing.value.details() or "")
