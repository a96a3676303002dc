"""Hostile bodies are refused before they are parsed, and large ones are parsed off the loop.

One mesh on its own redis-server, with a 16 MiB body limit and bodies over 4 KiB parsed in
a parse thread, serves tiny_mlp (FP32 [-1, 64]) and two Python models with BYTES inputs and
no ``max_input_bytes``: ``text_length`` (dims [1], batches of up to 8) and ``text_count``
(dims [-1], no batching, so nothing bounds its body but the body limit).

Each attack runs while a probe thread sends small valid tiny_mlp requests: the attack gets
its clean KServe error, the gateway's peak RSS stays a small multiple of the body, and the
probe is answered within a bound meanwhile. Before these checks a 16 MB body of one-element
lists held the gateway's event loop about 2.7 s and took over 500 MB.
"""

from __future__ import annotations

import shutil
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
import pytest
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import Mesh, private_mesh, wait_until
from tests.gateway.test_hostile_input import PeakRss

BODY_LIMIT_BYTES = 16 * 1024 * 1024
ATTACK_BYTES = 15 * 1024 * 1024
# A probe request answered within this while an attack is handled: the attacks measured
# 2 to 3 s of stall before; a served probe takes milliseconds.
PROBE_BOUND_S = 0.75
SMALL = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]}

HANDLER = """
import numpy as np


class Counts:
    def initialize(self, context):
        self.output = "{output}"

    def inference(self, batch):
        texts = batch["TEXT"]
        if self.output == "LENGTH":
            return {{"LENGTH": np.array([[len(t)] for t in texts[:, 0]], dtype=np.int64)}}
        return {{"COUNT": np.array([texts.size], dtype=np.int64)}}
"""


def write_text_model(root: Path, name: str, dims: list[int], batch: int, output: str) -> None:
    version = root / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(HANDLER.format(output=output)))
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": batch,
        "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": dims}],
        "output": [{"name": output, "data_type": "TYPE_INT64", "dims": [1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    (root / name / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def offload_mesh(
    tmp_path_factory: pytest.TempPathFactory, example_repository: Path
) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("offload") / "models"
    shutil.copytree(example_repository / "tiny_mlp", root / "tiny_mlp")
    write_text_model(root, "text_length", [1], 8, "LENGTH")
    write_text_model(root, "text_count", [-1], 0, "COUNT")
    env = {
        "WEIR_GATEWAY_BODY_LIMIT_BYTES": str(BODY_LIMIT_BYTES),
        "WEIR_GATEWAY_PARSE_INLINE_BYTES": "4096",
        "WEIR_GATEWAY_PARSE_THREADS": "2",
    }
    with private_mesh(root, env) as running:
        yield running


class Probe:
    """Small valid requests, one after another, each one's latency kept while it runs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                response = client.post("/v2/models/tiny_mlp/infer", json=SMALL)
                self.latencies.append(time.monotonic() - started)
                if response.status_code != 200:
                    self.failures.append(response.text[:200])

    def __enter__(self) -> Probe:
        self._thread.start()
        wait_until(lambda: len(self.latencies) >= 5, 30, "the probe's first answers")
        self.during = len(self.latencies)
        return self

    def __exit__(self, *_: object) -> None:
        # The probe's request in flight when the attack ends counts too.
        count = len(self.latencies)
        wait_until(lambda: len(self.latencies) > count + 1, 30, "the probe's next answers")
        self._stop.set()
        self._thread.join()

    @property
    def worst_s(self) -> float:
        return max(self.latencies[self.during :])


def under_attack(mesh: Mesh, send: Callable[[], Any]) -> tuple[Any, Probe, PeakRss]:
    """``send()``'s result, with the probe and the gateway's RSS watched meanwhile."""
    with PeakRss(mesh.processes["gateway"].pid) as rss, Probe(mesh.url) as probe:
        result = send()
    assert not probe.failures, probe.failures
    return result, probe, rss


def post(mesh: Mesh, model: str, body: bytes) -> Callable[[], httpx.Response]:
    return lambda: httpx.post(f"{mesh.url}/v2/models/{model}/infer", content=body, timeout=60)


def json_body(name: str, datatype: str, shape: list[int], data: bytes) -> bytes:
    head = b'{"inputs":[{"name":"%s","datatype":"%s","shape":[%s],"data":' % (
        name.encode(),
        datatype.encode(),
        ",".join(map(str, shape)).encode(),
    )
    return head + data + b"}]}"


def repeated(element: bytes, size: int) -> bytes:
    return b"[" + b",".join([element] * (size // (len(element) + 1))) + b"]"


def assert_quick_and_small(probe: Probe, rss: PeakRss, body_bytes: int) -> None:
    assert probe.worst_s < PROBE_BOUND_S, f"a probe waited {probe.worst_s:.2f} s"
    # Reading the body holds it about twice; parsing it would hold tens of times more.
    assert rss.growth < 6 * body_bytes, f"gateway RSS grew {rss.growth / 2**20:.0f} MiB"


def test_one_element_lists_past_what_the_shapes_need_are_a_400_before_parsing(
    offload_mesh: Mesh,
) -> None:
    body = json_body("INPUT0", "FP32", [1, 64], repeated(b"[0]", ATTACK_BYTES))
    response, probe, rss = under_attack(offload_mesh, post(offload_mesh, "tiny_mlp", body))
    assert response.status_code == 400, response.text[:300]
    # 64 rows of 64 elements in 1 + 64 lists, and the extra allowance.
    assert response.json() == {
        "error": "the JSON of the request holds more than 20545 commas, lists and objects: "
        "the inputs of model 'tiny_mlp' take 4161 at most, and WEIR_GATEWAY_JSON_EXTRA_ITEMS "
        "(16384) more are allowed beside them"
    }
    assert_quick_and_small(probe, rss, len(body))


def test_empty_strings_past_a_bytes_inputs_count_are_a_400_before_parsing(
    offload_mesh: Mesh,
) -> None:
    # BYTES, and no max_input_bytes: the text is unbounded, the count of elements is not.
    body = json_body("TEXT", "BYTES", [1, 1], repeated(b'""', ATTACK_BYTES))
    response, probe, rss = under_attack(offload_mesh, post(offload_mesh, "text_length", body))
    assert response.status_code == 400, response.text[:300]
    assert response.json() == {
        "error": "the JSON of the request holds more than 16401 commas, lists and objects: "
        "the inputs of model 'text_length' take 17 at most, and WEIR_GATEWAY_JSON_EXTRA_ITEMS "
        "(16384) more are allowed beside them"
    }
    assert_quick_and_small(probe, rss, len(body))


def test_commas_inside_strings_are_not_counted_as_items(offload_mesh: Mesh) -> None:
    # 800 000 commas and brackets among quotes and backslashes, escaped: 4 MB of JSON text.
    text = 'a,"[b\\{",' * 400_000
    body = json_body("TEXT", "BYTES", [1, 1], orjson.dumps([text]))
    response = post(offload_mesh, "text_length", body)()
    assert response.status_code == 200, response.text[:300]
    assert response.json()["outputs"][0]["data"] == [len(text)]


def test_a_large_bytes_body_no_shape_bounds_is_parsed_beside_the_event_loop(
    offload_mesh: Mesh,
) -> None:
    # Valid and unbounded ([-1] dims): ~1.5 s of Python work per million strings, which on
    # the event loop would hold every other request that long.
    count = 1_500_000
    body = json_body("TEXT", "BYTES", [count], repeated(b'"ab"', 5 * count + 1))
    response, probe, _ = under_attack(offload_mesh, post(offload_mesh, "text_count", body))
    assert response.status_code == 200, response.text[:300]
    assert response.json()["outputs"][0]["data"] == [count]
    assert probe.worst_s < PROBE_BOUND_S, f"a probe waited {probe.worst_s:.2f} s"


def test_a_json_body_over_the_inline_size_is_answered_as_one_under_it(
    offload_mesh: Mesh,
) -> None:
    x = np.random.default_rng(7).standard_normal((64, 64), dtype=np.float32)
    small = {"inputs": [{**SMALL["inputs"][0], "data": x[:1].tolist()}]}  # type: ignore[dict-item]
    large = {"inputs": [{**SMALL["inputs"][0], "shape": [64, 64], "data": x.tolist()}]}  # type: ignore[dict-item]
    answers = [
        httpx.post(f"{offload_mesh.url}/v2/models/tiny_mlp/infer", json=body, timeout=30)
        for body in (small, large)
    ]
    assert [a.status_code for a in answers] == [200, 200], [a.text[:200] for a in answers]
    first, rows = (np.asarray(a.json()["outputs"][0]["data"]) for a in answers)
    np.testing.assert_allclose(rows.reshape(64, 16)[0], first, rtol=1e-5, atol=1e-6)


# --- gRPC ----------------------------------------------------------------------------------


@pytest.fixture
def stub(offload_mesh: Mesh) -> Iterator[Any]:
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(offload_mesh.grpc_target, options=options) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_refusal(stub: Any, request: Any) -> Callable[[], grpc.RpcError]:
    def send() -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=60)
        return raised.value

    return send


def test_raw_contents_past_the_shapes_size_are_refused(offload_mesh: Mesh, stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.append(b"\0" * ATTACK_BYTES)
    error, probe, rss = under_attack(offload_mesh, grpc_refusal(stub, request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input byte size mismatch for input 'INPUT0' for model 'tiny_mlp'. Expected 256, "
        f"got {ATTACK_BYTES}"
    )
    assert_quick_and_small(probe, rss, ATTACK_BYTES)


def test_more_raw_contents_than_inputs_are_refused_before_any_is_read(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    request.raw_input_contents.extend([b"\0" * 256] * 1000)
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details().startswith("request has 1000 raw_input_contents for 1 inputs")


class GrpcProbe(Probe):
    """The probe's small valid requests, over gRPC (``url`` is the gRPC target)."""

    def _run(self) -> None:
        request = service_pb2.ModelInferRequest(model_name="tiny_mlp")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
        request.raw_input_contents.append(bytes(256))
        with grpc.insecure_channel(self.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    stub.ModelInfer(request, timeout=30)
                except grpc.RpcError as exc:
                    self.failures.append(str(exc.details()))
                self.latencies.append(time.monotonic() - started)


def empty_strings(elements: int) -> Any:
    """text_length's TEXT ([1, 1]) with ``elements`` empty strings in bytes_contents."""
    request = service_pb2.ModelInferRequest(model_name="text_length", id="attack")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    tensor.contents.bytes_contents.extend([b""] * elements)
    return request


def test_empty_bytes_contents_past_the_shapes_count_are_refused_undecoded(
    offload_mesh: Mesh, stub: Any
) -> None:
    # 4 MB: 2 million elements, which protobuf would spend 0.1 s building on the event loop
    # (a 60 MB message, 1.8 s); counted on the wire instead, and only up to the second.
    request = empty_strings(2_000_000)
    send = grpc_refusal(stub, request)
    with (
        PeakRss(offload_mesh.processes["gateway"].pid) as rss,
        GrpcProbe(offload_mesh.grpc_target) as grpc_probe,
        Probe(offload_mesh.url) as probe,
    ):
        started = time.monotonic()
        error = send()
        took_s = time.monotonic() - started
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input 'TEXT': shape [1, 1] needs 1 elements, its contents hold more than 1"
    )
    assert took_s < PROBE_BOUND_S, f"the refusal took {took_s:.2f} s"
    assert not probe.failures and not grpc_probe.failures, probe.failures + grpc_probe.failures
    for watched in (probe, grpc_probe):
        assert_quick_and_small(watched, rss, request.ByteSize())


def test_a_streamed_message_past_its_shape_is_answered_with_its_error(stub: Any) -> None:
    answers = list(stub.ModelStreamInfer(iter([empty_strings(100_000)]), timeout=30))
    assert [a.error_message for a in answers] == [
        "input 'TEXT': shape [1, 1] needs 1 elements, its contents hold more than 1"
    ]
    assert answers[0].infer_response.id == "attack"


def test_a_grpc_request_over_the_inline_size_is_answered(stub: Any) -> None:
    x = np.random.default_rng(8).standard_normal((64, 64), dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="tiny_mlp")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[64, 64])
    request.raw_input_contents.append(x.tobytes())
    response = stub.ModelInfer(request, timeout=30)
    rows = np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(64, 16)
    single = service_pb2.ModelInferRequest(model_name="tiny_mlp")
    single.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 64])
    single.raw_input_contents.append(x[:1].tobytes())
    first = np.frombuffer(stub.ModelInfer(single, timeout=30).raw_output_contents[0], np.float32)
    np.testing.assert_allclose(rows[0], first, rtol=1e-5, atol=1e-6)
