"""Triton's sequence batcher over the mesh: a gateway, a batcher and a worker, real models.

A Python, a TorchScript and an ONNX accumulator each keep their sum in implicit state, kept in
Redis between requests. Sequences sent interleaved on one gRPC stream with tritonclient come
back summed each on its own, with the control inputs Triton gives; the rules Triton's clients
meet (a correlation id, a START first, batch size 1, an idle sequence ending) answer with
Triton's words.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import Mesh, private_mesh, wait_until
from tests.sequences.models import write_repository

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    repository = write_repository(tmp_path_factory.mktemp("sequences"), idle_us=1_500_000)
    with private_mesh(repository) as running:
        yield running


def int_input(value: int, client=grpcclient):  # type: ignore[no-untyped-def]
    tensor = client.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return tensor


def test_interleaved_sequences_on_one_stream_each_keep_their_sum(mesh: Mesh) -> None:
    values = {101: [3, 4, 5, 6], 102: [10, 20, 30, 40], 103: [7, 7, 7, 7]}
    answers: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for step in range(4):
            for sequence_id, steps in values.items():
                client.async_stream_infer(
                    "py_acc",
                    [int_input(steps[step])],
                    request_id=f"{sequence_id}-{step}",
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == 3,
                )
        got = {}
        for _ in range(12):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = result
    finally:
        client.stop_stream()
        client.close()
    for sequence_id, steps in values.items():
        for step in range(4):
            result = got[f"{sequence_id}-{step}"]
            assert result.as_numpy("OUTPUT").item() == sum(steps[: step + 1])
            assert result.as_numpy("CORR").item() == sequence_id
            flags = (1 if step == 0 else 0) | (2 if step == 3 else 0)
            assert result.as_numpy("FLAGS").item() == flags
            assert result.as_numpy("OUTPUT_STATE") is None  # state stays in the server


def test_a_long_sequence_sent_at_once_runs_in_order(mesh: Mesh) -> None:
    answers: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for step in range(40):
            client.async_stream_infer(
                "py_acc",
                [int_input(step)],
                request_id=str(step),
                sequence_id=555,
                sequence_start=step == 0,
                sequence_end=step == 39,
            )
        sums = {}
        for _ in range(40):
            result, error = answers.get(timeout=60)
            assert error is None, error
            sums[int(result.get_response().id)] = result.as_numpy("OUTPUT").item()
    finally:
        client.stop_stream()
        client.close()
    assert sums == {step: step * (step + 1) // 2 for step in range(40)}


def test_requests_of_different_sequences_share_batches(mesh: Mesh) -> None:
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    answers: queue.Queue = queue.Queue()  # type: ignore[type-arg]
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for sequence_id in range(200, 232):
            client.async_stream_infer(
                "py_acc", [int_input(1)], sequence_id=sequence_id, sequence_start=True
            )
        sizes = []
        for _ in range(32):
            result, error = answers.get(timeout=60)
            assert error is None, error
            sizes.append(result.as_numpy("BATCH").item())
    finally:
        client.stop_stream()
        client.close()
    assert max(sizes) > 1, sizes


@pytest.mark.parametrize("model", ["torch_acc", "onnx_acc"])
def test_torchscript_and_onnx_models_carry_implicit_state(mesh: Mesh, model: str) -> None:
    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    rows = np.random.default_rng(5).standard_normal((5, 1, 2)).astype(np.float32)
    try:
        for sequence_id in ("left", 77):  # string and integer ids
            for step, row in enumerate(rows):
                tensor = httpclient.InferInput("INPUT", [1, 2], "FP32")
                tensor.set_data_from_numpy(row)
                result = client.infer(
                    model,
                    [tensor],
                    sequence_id=sequence_id,
                    sequence_start=step == 0,
                    sequence_end=step == len(rows) - 1,
                )
                np.testing.assert_allclose(
                    result.as_numpy("OUTPUT"), rows[: step + 1].sum(axis=0), rtol=1e-5
                )
    finally:
        client.close()


def test_an_unbatched_model_keeps_a_string_state_of_its_own_length(mesh: Mesh) -> None:
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    texts = []
    try:
        for step, word in enumerate([b"the", b"quick", b"fox"]):
            tensor = grpcclient.InferInput("WORD", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([word], dtype=object))
            result = client.infer(
                "py_text", [tensor], sequence_id="words-1", sequence_start=step == 0
            )
            assert result.as_numpy("ID")[0] == b"words-1"
            texts.append(result.as_numpy("TEXT")[0])
    finally:
        client.close()
    assert texts == [b"the", b"the quick", b"the quick fox"]


def infer(mesh: Mesh, parameters: dict, value: int = 1, rows: int = 1) -> httpx.Response:  # type: ignore[type-arg]
    body = {
        "inputs": [
            {"name": "INPUT", "datatype": "INT32", "shape": [rows, 1], "data": [value] * rows}
        ],
        "parameters": parameters,
    }
    return httpx.post(f"{mesh.url}/v2/models/py_acc/infer", json=body, timeout=30)


def test_the_rules_triton_clients_meet_answer_with_tritons_words(mesh: Mesh) -> None:
    missing = infer(mesh, {})
    assert missing.status_code == 400
    assert "must specify a non-zero or non-empty correlation ID" in missing.json()["error"]
    not_started = infer(mesh, {"sequence_id": 9001})
    assert not_started.status_code == 400
    assert (
        "inference request for sequence 9001 to model 'py_acc' must specify the START flag "
        "on the first request of the sequence"
    ) in not_started.json()["error"]
    two_rows = infer(mesh, {"sequence_id": 9002, "sequence_start": True}, rows=2)
    assert two_rows.status_code == 400
    assert "batch-size 1" in two_rows.json()["error"]
    text_id = infer(mesh, {"sequence_id": "text", "sequence_start": True})
    assert text_id.status_code == 400
    assert "does not fit input 'CORRID' (UINT64" in text_id.json()["error"]
    started = infer(mesh, {"sequence_id": 9003, "sequence_start": True, "sequence_end": True}, 5)
    assert started.status_code == 200, started.text
    after_end = infer(mesh, {"sequence_id": 9003})
    assert after_end.status_code == 400
    assert "must specify the START flag" in after_end.json()["error"]


def test_a_pipeline_passes_its_sequence_to_its_stateful_step(mesh: Mesh) -> None:
    totals = []
    for step, value in enumerate([2, 3, 4]):
        body = {
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
            "parameters": {"sequence_id": 64, "sequence_start": step == 0},
        }
        response = httpx.post(f"{mesh.url}/v2/models/acc_pipeline/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        totals.append(response.json()["outputs"][0]["data"][0])
    assert totals == [2, 5, 9]
    body["parameters"] = {}
    response = httpx.post(f"{mesh.url}/v2/models/acc_pipeline/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert "to model 'py_acc' must specify a non-zero" in response.json()["error"]


def test_a_sequence_idle_past_its_limit_ends(mesh: Mesh) -> None:
    started = infer(mesh, {"sequence_id": 31, "sequence_start": True}, 4)
    assert started.json()["outputs"][0]["data"] == [4]
    going_on = infer(mesh, {"sequence_id": 31}, 1)
    assert going_on.json()["outputs"][0]["data"] == [5]
    # max_sequence_idle_microseconds is 1.5 s: the sequence ends with nothing sent.
    wait_until(
        lambda: infer(mesh, {"sequence_id": 31}).status_code == 400,
        10,
        "the sequence to end",
        interval_s=2,
    )


def test_state_outputs_reach_a_client_only_when_listed_in_output(
    mesh: Mesh, tmp_path: Path
) -> None:
    with pytest.raises(InferenceServerException, match="OUTPUT_STATE"):
        client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
        try:
            client.infer(
                "py_acc",
                [int_input(1, httpclient)],
                outputs=[httpclient.InferRequestedOutput("OUTPUT_STATE")],
                sequence_id=4040,
                sequence_start=True,
            )
        finally:
            client.close()


def test_the_model_config_shows_its_sequence_batching(mesh: Mesh) -> None:
    grpc = grpcclient.InferenceServerClient(mesh.grpc_target)
    http = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        over_grpc = grpc.get_model_config("py_acc", as_json=True)["config"]["sequence_batching"]
        over_http = http.get_model_config("py_acc")["sequence_batching"]
        with_initial = grpc.get_model_config("torch_acc", as_json=True)["config"]
    finally:
        grpc.close()
        http.close()
    for shown in (over_grpc, over_http):
        kinds = [
            c["control"][0].get("kind", "CONTROL_SEQUENCE_START") for c in shown["control_input"]
        ]
        assert kinds[1:] == [
            "CONTROL_SEQUENCE_END",
            "CONTROL_SEQUENCE_READY",
            "CONTROL_SEQUENCE_CORRID",
        ]
        assert shown["state"][0]["input_name"] == "INPUT_STATE"
        assert int(shown["max_sequence_idle_microseconds"]) == 1_500_000
    (state,) = with_initial["sequence_batching"]["state"]
    assert state["initial_state"][0]["zero_data"] is True
    assert state["data_type"] == "TYPE_FP32"
