"""KServe v2 over real gRPC, with ``tritonclient.grpc`` unmodified, against the running mesh.

Most tests use the session mesh's gateway, which serves gRPC beside HTTP on the same state;
answers are compared with the TorchScript models run in-process and with what HTTP says.
More gateways join the session's Redis (one with bearer tokens, one with two processes, one
whose gRPC port is taken) and ``weir up`` runs once, on a repository holding tiny_mlp alone.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.chaos.helpers import Topology, private_repository
from tests.conftest import BODY_LIMIT_BYTES, Mesh, http_ready, wait_until
from tests.weir_up import port_open, weir_up
from weir import errors
from weir.redis_server import free_port

INFERENCE_TOKEN = "grpc-infer-secret"
MANAGEMENT_TOKEN = "grpc-admin-secret"


@pytest.fixture
def client(mesh: Mesh) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(mesh.grpc_target)
    yield triton
    triton.close()


def reference(build_models: ModuleType, model: str, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module(model)(torch.from_numpy(x)).numpy()


def rows(count: int, width: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width), dtype=np.float32)


def infer_input(x: np.ndarray, name: str = "INPUT0", datatype: str = "FP32") -> Any:
    tensor = grpcclient.InferInput(name, list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return tensor


def rpc_error(call: Callable[[], Any], status: grpc.StatusCode) -> str:
    """Run ``call``, expect it to fail with ``status``; return the error's message."""
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() == str(status), caught.value
    return str(caught.value.message())


def http_error(mesh: Mesh, model: str, body: dict[str, Any]) -> tuple[int, str]:
    response = httpx.post(f"{mesh.url}/v2/models/{model}/infer", json=body, timeout=30)
    return response.status_code, response.json()["error"]


# --- health, metadata, config -----------------------------------------------------------------


@pytest.mark.cluster_too
def test_liveness_readiness_and_server_metadata_match_http(
    mesh: Mesh, client: grpcclient.InferenceServerClient
) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("tiny_mlp")
    assert client.is_model_ready("tiny_mlp", "1")
    assert client.is_model_ready("minilm_embed")  # a pipeline: every step is served
    assert not client.is_model_ready("no_such_model")  # as Triton: not ready, no error
    assert not client.is_model_ready("tiny_mlp", "9")
    served = client.get_server_metadata(as_json=True)
    assert served == httpx.get(f"{mesh.url}/v2").json()


@pytest.mark.parametrize("model", ["tiny_mlp", "minilm_embed"])
def test_model_metadata_is_what_http_reports(
    mesh: Mesh, client: grpcclient.InferenceServerClient, model: str
) -> None:
    over_http = httpx.get(f"{mesh.url}/v2/models/{model}").json()
    expected = json_format.ParseDict(over_http, service_pb2.ModelMetadataResponse())
    assert client.get_model_metadata(model) == expected
    assert client.get_model_metadata(model, "1").versions == ["1"]


def test_model_config_carries_the_repository_config_in_model_config_proto(
    client: grpcclient.InferenceServerClient,
) -> None:
    config = client.get_model_config("tiny_mlp").config
    assert (config.name, config.platform, config.max_batch_size) == (
        "tiny_mlp",
        "pytorch_libtorch",
        64,
    )
    (tensor,) = config.input
    assert (tensor.name, tensor.data_type, list(tensor.dims)) == ("INPUT0", 11, [64])  # FP32
    (tensor,) = config.output
    assert (tensor.name, list(tensor.dims)) == ("OUTPUT0", [16])
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert (config.instance_group[0].kind, config.instance_group[0].count) == (
        config.instance_group[0].KIND_CPU,
        1,
    )
    as_json = client.get_model_config("minilm_embed", as_json=True)["config"]
    assert as_json["platform"] == "ensemble"
    steps = as_json["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["minilm_tokenizer", "minilm_encoder", "minilm_pool"]
    assert as_json["input"][0]["data_type"] == "TYPE_STRING"


# --- inference --------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "width"), [("tiny_mlp", 64), ("wide_mlp", 1024)])
@pytest.mark.cluster_too
def test_inference_matches_the_torchscript_model_run_in_process(
    client: grpcclient.InferenceServerClient, build_models: ModuleType, model: str, width: int
) -> None:
    x = rows(3, width, seed=1)
    result = client.infer(
        model,
        [infer_input(x)],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
        request_id="grpc-42",
    )
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (model, "1", "grpc-42")
    assert len(response.raw_output_contents) == 1  # outputs travel raw, as Triton sends them
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT0"), reference(build_models, model, x), rtol=1e-4, atol=1e-5
    )


@pytest.mark.cluster_too
def test_typed_contents_are_answered_like_raw_inputs(
    mesh: Mesh, client: grpcclient.InferenceServerClient
) -> None:
    x = rows(2, seed=2)
    raw = client.infer("tiny_mlp", [infer_input(x)]).as_numpy("OUTPUT0")
    request = service_pb2.ModelInferRequest(model_name="tiny_mlp", id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 64])
    tensor.contents.fp32_contents.extend(x.reshape(-1).tolist())
    with grpc.insecure_channel(mesh.grpc_target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "FP32", [2, 16])
    typed = np.frombuffer(response.raw_output_contents[0], dtype="<f4").reshape(2, 16)
    np.testing.assert_array_equal(typed, raw)


@pytest.mark.cluster_too
def test_bytes_input_through_the_pipeline_matches_http(
    mesh: Mesh, client: grpcclient.InferenceServerClient
) -> None:
    sentences = ["Weir speaks gRPC.", "The same tensors as over HTTP."]
    text = np.array([[s.encode()] for s in sentences], dtype=object)
    result = client.infer("minilm_embed", [infer_input(text, "TEXT", "BYTES")])
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2, 1], "data": sentences}]}
    response = httpx.post(f"{mesh.url}/v2/models/minilm_embed/infer", json=body, timeout=60)
    (output,) = response.json()["outputs"]
    over_http = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(result.as_numpy("EMBEDDING"), over_http, atol=1e-5)


BAD_INPUTS = [
    pytest.param(np.zeros((1, 32), np.float32), "FP32", "got [1,32]", id="shape"),
    pytest.param(np.zeros((1, 64), np.float64), "FP64", "datatype FP64", id="datatype"),
    pytest.param(np.zeros((65, 64), np.float32), "FP32", "max_batch_size", id="batch"),
]


@pytest.mark.parametrize(("x", "datatype", "fragment"), BAD_INPUTS)
def test_a_bad_input_is_invalid_argument_with_the_http_message(
    mesh: Mesh,
    client: grpcclient.InferenceServerClient,
    x: np.ndarray,
    datatype: str,
    fragment: str,
) -> None:
    message = rpc_error(
        lambda: client.infer("tiny_mlp", [infer_input(x, datatype=datatype)]),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    tensor = {"name": "INPUT0", "datatype": datatype, "shape": list(x.shape)}
    status, over_http = http_error(mesh, "tiny_mlp", {"inputs": [{**tensor, "data": x.tolist()}]})
    assert fragment in message and "INPUT0" in message
    assert (status, over_http) == (400, message)


def test_unknown_model_or_version_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    x = infer_input(rows(1))
    not_found = grpc.StatusCode.NOT_FOUND
    assert rpc_error(lambda: client.infer("no_such_model", [x]), not_found) == (
        "Request for unknown model: 'no_such_model' is not found"
    )
    assert "Request for unknown model: 'tiny_mlp' version 9 is not found" in rpc_error(
        lambda: client.infer("tiny_mlp", [x], model_version="9"), not_found
    )
    rpc_error(lambda: client.get_model_metadata("no_such_model"), not_found)
    rpc_error(lambda: client.get_model_config("no_such_model"), not_found)


@pytest.mark.cluster_too
def test_a_request_past_its_deadline_is_deadline_exceeded(
    client: grpcclient.InferenceServerClient,
) -> None:
    message = rpc_error(
        lambda: client.infer("tiny_mlp", [infer_input(rows(1))], timeout=1),  # microseconds
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )
    # The gateway's wait or the batcher's queue, whichever notices first, names the model.
    assert "model 'tiny_mlp' version '1'" in message


def test_a_message_over_the_body_limit_is_refused_before_parsing(
    client: grpcclient.InferenceServerClient,
) -> None:
    x = np.zeros((BODY_LIMIT_BYTES // 256 + 8, 64), np.float32)
    message = rpc_error(
        lambda: client.infer("tiny_mlp", [infer_input(x)]), grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    assert str(BODY_LIMIT_BYTES) in message


def test_calls_weir_does_not_implement_say_what_is_missing(
    client: grpcclient.InferenceServerClient,
) -> None:
    unavailable = grpc.StatusCode.UNAVAILABLE
    assert "CUDA shared memory" in rpc_error(client.get_cuda_shared_memory_status, unavailable)


def test_model_control_in_mode_none_is_refused_as_triton_refuses_it(
    client: grpcclient.InferenceServerClient,
) -> None:
    unavailable = grpc.StatusCode.UNAVAILABLE
    message = rpc_error(lambda: client.load_model("tiny_mlp"), unavailable)
    assert message == "explicit model load / unload is not allowed if polling is enabled"
    assert "not allowed" in rpc_error(lambda: client.unload_model("tiny_mlp"), unavailable)


def test_repository_index_lists_every_served_version(
    client: grpcclient.InferenceServerClient,
) -> None:
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {"name": "tiny_mlp", "version": "1", "state": "READY"} in index
    assert {m["name"] for m in index} >= {"tiny_mlp", "wide_mlp", "minilm_embed"}


# --- statistics and metrics -------------------------------------------------------------------


def success_and_invalid(mesh: Mesh) -> tuple[float, float]:
    """The gateway's success and INVALID failure counters for tiny_mlp."""
    found = {
        (sample.name, sample.labels.get("reason", "")): sample.value
        for family in text_string_to_metric_families(httpx.get(mesh.metrics_url).text)
        for sample in family.samples
        if sample.labels.get("model") == "tiny_mlp"
    }
    return (
        found.get(("weir_inference_request_success_total", ""), 0.0),
        found.get(("weir_inference_request_failure_total", "INVALID"), 0.0),
    )


@pytest.mark.cluster_too
def test_statistics_and_metrics_count_grpc_inferences(
    mesh: Mesh, client: grpcclient.InferenceServerClient
) -> None:
    before = client.get_inference_statistics("tiny_mlp").model_stats[0]
    succeeded, invalid = success_and_invalid(mesh)
    client.infer("tiny_mlp", [infer_input(rows(3, seed=3))])
    client.infer("tiny_mlp", [infer_input(rows(2, seed=4))])
    bad = infer_input(np.zeros((1, 64), np.float64), datatype="FP64")
    rpc_error(lambda: client.infer("tiny_mlp", [bad]), grpc.StatusCode.INVALID_ARGUMENT)

    after = client.get_inference_statistics("tiny_mlp", "1").model_stats[0]
    assert after.inference_count == before.inference_count + 5
    assert after.inference_stats.success.count == before.inference_stats.success.count + 2
    assert success_and_invalid(mesh) == (succeeded + 2, invalid + 1)
    over_http = httpx.get(f"{mesh.url}/v2/models/tiny_mlp/stats").json()["model_stats"][0]
    assert json_format.ParseDict(over_http, service_pb2.ModelStatistics()) == after
    every_model = client.get_inference_statistics().model_stats
    assert {(s.name, s.version) for s in every_model} >= {("tiny_mlp", "1"), ("wide_mlp", "1")}


def test_grpc_status_for_each_weir_error_is_tritons() -> None:
    from gateway.grpc_service import grpc_status

    expected = {
        errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
        errors.Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
        errors.NotFound: grpc.StatusCode.NOT_FOUND,
        errors.BodyTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
        errors.Unavailable: grpc.StatusCode.UNAVAILABLE,  # e.g. a full queue
        errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
        errors.ServerError: grpc.StatusCode.INTERNAL,
    }
    for cls, status in expected.items():
        assert grpc_status(cls("x")) == status, cls


# --- streaming --------------------------------------------------------------------------------


def collect_stream(
    client: grpcclient.InferenceServerClient,
    send: Callable[[], None],
    count: int,
    headers: dict[str, str] | None = None,
) -> list[tuple[Any, Any]]:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: answers.put((result, error)), headers=headers
    )
    try:
        send()
        return [answers.get(timeout=30) for _ in range(count)]
    finally:
        client.stop_stream()


@pytest.mark.cluster_too
def test_stream_answers_every_request_and_reports_errors_in_the_stream(
    client: grpcclient.InferenceServerClient, build_models: ModuleType
) -> None:
    inputs = {f"req-{i}": rows(i + 1, seed=10 + i) for i in range(4)}

    def send() -> None:
        for request_id, x in inputs.items():
            client.async_stream_infer("tiny_mlp", [infer_input(x)], request_id=request_id)
        bad = infer_input(np.zeros((1, 32), np.float32))
        client.async_stream_infer("tiny_mlp", [bad], request_id="bad")

    answers = collect_stream(client, send, len(inputs) + 1)
    errors_seen = [str(error.message()) for result, error in answers if error is not None]
    assert len(errors_seen) == 1 and "got [1,32]" in errors_seen[0]
    results = {r.get_response().id: r for r, error in answers if error is None}
    assert set(results) == set(inputs)
    for request_id, x in inputs.items():
        np.testing.assert_allclose(
            results[request_id].as_numpy("OUTPUT0"),
            reference(build_models, "tiny_mlp", x),
            rtol=1e-4,
            atol=1e-5,
        )


# --- bearer tokens ----------------------------------------------------------------------------


def start_gateway(mesh: Mesh, log_dir: Path, **env: str) -> tuple[Topology, str]:
    """One more gateway on the session mesh's Redis; its gRPC target once it is live."""
    topology = Topology(mesh.redis_url, mesh.repository, log_dir)
    http_port, grpc_port = free_port(), free_port()
    topology.start(
        "gateway",
        "gateway",
        WEIR_GATEWAY_HTTP_PORT=str(http_port),
        WEIR_GATEWAY_GRPC_PORT=str(grpc_port),
        **env,
    )
    try:
        live = f"http://127.0.0.1:{http_port}/v2/health/live"
        wait_until(lambda: http_ready(live), 60, "the extra gateway to be live")
    except BaseException:
        topology.stop_all()
        raise
    return topology, f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module")
def token_client(
    mesh: Mesh, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[grpcclient.InferenceServerClient]:
    topology, target = start_gateway(
        mesh,
        tmp_path_factory.mktemp("grpc-auth"),
        WEIR_GATEWAY_INFERENCE_TOKEN=INFERENCE_TOKEN,
        WEIR_GATEWAY_MANAGEMENT_TOKEN=MANAGEMENT_TOKEN,
    )
    triton = grpcclient.InferenceServerClient(target)
    yield triton
    triton.close()
    topology.stop_all()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_inference_needs_the_inference_token(
    token_client: grpcclient.InferenceServerClient,
) -> None:
    x = [infer_input(rows(1))]
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    message = rpc_error(lambda: token_client.infer("tiny_mlp", x), unauthenticated)
    assert message == "this inference route needs a valid bearer token"
    for wrong in (bearer("wrong"), {"authorization": f"Basic {INFERENCE_TOKEN}"}):
        rpc_error(lambda h=wrong: token_client.infer("tiny_mlp", x, headers=h), unauthenticated)
    rpc_error(lambda: token_client.get_model_metadata("tiny_mlp"), unauthenticated)
    answered = token_client.infer("tiny_mlp", x, headers=bearer(INFERENCE_TOKEN))
    assert answered.as_numpy("OUTPUT0").shape == (1, 16)
    # Health and server metadata stay open, as over HTTP.
    assert token_client.is_server_live() and token_client.is_server_ready()
    assert token_client.get_server_metadata().name == "weir"


def test_statistics_need_the_management_token(
    token_client: grpcclient.InferenceServerClient,
) -> None:
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    message = rpc_error(
        lambda: token_client.get_inference_statistics("tiny_mlp", headers=bearer(INFERENCE_TOKEN)),
        unauthenticated,
    )
    assert "management" in message
    stats = token_client.get_inference_statistics("tiny_mlp", headers=bearer(MANAGEMENT_TOKEN))
    assert stats.model_stats[0].name == "tiny_mlp"


def test_a_stream_without_the_token_is_refused(
    token_client: grpcclient.InferenceServerClient,
) -> None:
    def send() -> None:
        token_client.async_stream_infer("tiny_mlp", [infer_input(rows(1))])

    def send_refused() -> None:
        # The gateway may refuse the stream before the request is sent; then sending fails
        # and the refusal reaches the callback all the same.
        with contextlib.suppress(InferenceServerException):
            send()

    ((result, error),) = collect_stream(token_client, send_refused, 1)
    assert result is None and error.status() == str(grpc.StatusCode.UNAUTHENTICATED)
    ((result, error),) = collect_stream(token_client, send, 1, bearer(INFERENCE_TOKEN))
    assert error is None and result.as_numpy("OUTPUT0").shape == (1, 16)


# --- several processes, weir up ---------------------------------------------------------------


@pytest.mark.timeout(90)
def test_every_process_of_a_multi_process_gateway_serves_grpc_on_the_one_port(
    mesh: Mesh, tmp_path: Path
) -> None:
    topology, target = start_gateway(mesh, tmp_path, WEIR_GATEWAY_PROCESSES="2")
    try:
        wait_until(
            lambda: topology.log("gateway").count("serving KServe v2 gRPC") == 2,
            30,
            "both processes to serve gRPC",
        )
        x = rows(1, seed=5)
        for _ in range(12):
            # A new connection each time, so the kernel spreads them over both processes.
            with grpcclient.InferenceServerClient(target) as fresh:
                answered = fresh.infer("tiny_mlp", [infer_input(x)])
            assert answered.as_numpy("OUTPUT0").shape == (1, 16)
        gateway = topology.processes[0]
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(30) == 0
    finally:
        topology.stop_all()


def test_a_single_process_gateway_will_not_share_a_taken_grpc_port(
    mesh: Mesh, tmp_path: Path
) -> None:
    with socket.socket() as holder:
        # Even a holder that allows SO_REUSEPORT: one gateway process binds its port alone.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        topology = Topology(mesh.redis_url, mesh.repository, tmp_path)
        gateway = topology.start(
            "gateway",
            "gateway",
            WEIR_GATEWAY_HTTP_PORT=str(free_port()),
            WEIR_GATEWAY_GRPC_PORT=str(port),
        )
        try:
            assert gateway.wait(60) != 0
        finally:
            topology.stop_all()
    assert f"cannot serve gRPC on 127.0.0.1:{port}" in topology.log("gateway")


@pytest.mark.timeout(120)
def test_weir_up_serves_grpc(
    example_repository: Path, build_models: ModuleType, tmp_path: Path
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    http_port, grpc_port = free_port(), free_port()
    args = ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    args += ["--metrics-port", "0", "--repository", str(repository)]
    with weir_up(*args) as up:
        assert f"gRPC 127.0.0.1:{grpc_port}" in up.banner
        x = rows(2, seed=6)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as triton:
            assert triton.is_server_ready()
            got = triton.infer("tiny_mlp", [infer_input(x)]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(
            got, reference(build_models, "tiny_mlp", x), rtol=1e-4, atol=1e-5
        )
        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(60) == 0
        assert not port_open(grpc_port), "gRPC still listens after weir up exited"
