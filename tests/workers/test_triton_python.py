"""Triton Python models (``TritonPythonModel`` with ``triton_python_backend_utils``) on Weir.

``weir up`` serves a model written as Triton's Python backend documents it: ``initialize``
reads ``args["model_config"]``, ``execute`` reads each request's inputs with
``pb_utils.get_input_tensor_by_name`` and answers with ``pb_utils.InferenceResponse``, or
with a ``TritonError`` for a bad request. Requests of different sizes batched together
each get their own rows back; a failing request fails alone.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis

from tests.conftest import free_port, wait_until
from tests.weir_up import weir_up
from weir import names
from workers import bls
from workers.backends import pb_utils

CONFIG = """
    backend: python
    max_batch_size: 8
    input:
      - {name: INPUT0, data_type: TYPE_FP32, dims: [4]}
      - {name: INPUT1, data_type: TYPE_FP32, dims: [4]}
    output:
      - {name: OUTPUT0, data_type: TYPE_FP32, dims: [4]}
      - {name: OUTPUT1, data_type: TYPE_FP32, dims: [4]}
      - {name: ROWS, data_type: TYPE_INT32, dims: [1]}
    dynamic_batching:
      preferred_batch_size: [6]
      max_queue_delay_microseconds: 2000000
"""
MODEL = """
    import json
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            output = pb_utils.get_output_config_by_name(config, "OUTPUT0")
            self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])
            assert args["model_name"] == "add_sub" and args["model_version"] == "1"
            self.repository = args["model_repository"]

        def finalize(self):
            with open(self.repository + "/finalized", "w") as mark:
                mark.write("done")

        def execute(self, requests):
            if any(pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()[0, 0] == 99
                   for r in requests):
                # A slow batch: it holds the one instance until the test has queued the
                # requests behind it and says so.
                open(self.repository + "/slow_started", "w").close()
                deadline = time.monotonic() + 30
                while not os.path.exists(self.repository + "/release"):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)
            responses = []
            for request in requests:
                a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
                if (b < 0).any():
                    error = pb_utils.TritonError(
                        "INPUT1 must not be negative", pb_utils.TritonError.INVALID_ARG
                    )
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                parameters = json.loads(request.parameters())
                assert "timeout" not in parameters, "the server's parameter reached the model"
                scale = parameters.get("scale", 1)
                rows = np.full((a.shape[0], 1), a.shape[0] * scale, np.int32)
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtype)),
                            pb_utils.Tensor("OUTPUT1", a - b),
                            pb_utils.Tensor("ROWS", rows),
                        ]
                    )
                )
            return responses
"""


def body(a: np.ndarray, b: np.ndarray) -> dict[str, object]:
    def tensor(name: str, data: np.ndarray) -> dict[str, object]:
        shape = list(data.shape)
        return {"name": name, "shape": shape, "datatype": "FP32", "data": data.ravel().tolist()}

    return {"inputs": [tensor("INPUT0", a), tensor("INPUT1", b)]}


def read_by_batcher(redis_port: int) -> int:
    """How many add_sub requests the batchers have read, batched or not."""
    with redis.Redis(port=redis_port) as client:
        stream = names.request_stream("add_sub", "1")
        groups = client.xinfo_groups(stream) if client.exists(stream) else []
    return sum(
        int(g["entries-read"] or 0) for g in groups if g["name"] == names.BATCHER_GROUP.encode()
    )


def test_a_triton_python_model_answers_each_request_of_a_batch(tmp_path: Path) -> None:
    (tmp_path / "models" / "add_sub" / "1").mkdir(parents=True)
    (tmp_path / "models" / "add_sub" / "config.yaml").write_text(textwrap.dedent(CONFIG))
    (tmp_path / "models" / "add_sub" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    port, redis_port = free_port(), free_port()
    args = ["--repository", str(tmp_path / "models"), "--http-port", str(port)]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(redis_port)]
    model_dir = tmp_path / "models" / "add_sub"
    rng = np.random.default_rng(3)
    pairs = [(rng.random((n, 4), np.float32), rng.random((n, 4), np.float32)) for n in (1, 2, 3)]

    async def send_all(
        bodies: list[dict[str, object]], behind: dict[str, object] | None = None
    ) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            url = "/v2/models/add_sub/infer"
            if behind is None:
                return await asyncio.gather(*(client.post(url, json=b) for b in bodies))
            slow = asyncio.ensure_future(client.post(url, json=behind))
            await asyncio.to_thread(
                wait_until, (model_dir / "slow_started").exists, 30, "the slow batch to run"
            )
            answers = asyncio.gather(*(client.post(url, json=b) for b in bodies))
            # Released once the batcher has read every request sent (the slow one's too).
            await asyncio.to_thread(
                wait_until, lambda: read_by_batcher(redis_port) >= 1 + len(bodies), 30, "reads"
            )
            (model_dir / "release").touch()
            assert (await slow).status_code == 200
            return await answers

    with weir_up(*args):
        # 1 + 2 + 3 rows queued behind a slow batch: one batch of 6, one execute call of
        # three requests, each answered with its own rows.
        slow = body(np.full((2, 4), 99, np.float32), np.zeros((2, 4), np.float32))
        answers = asyncio.run(send_all([body(a, b) for a, b in pairs], behind=slow))
        for (a, b), answer in zip(pairs, answers, strict=True):
            assert answer.status_code == 200, answer.text
            outputs = {o["name"]: np.array(o["data"]) for o in answer.json()["outputs"]}
            np.testing.assert_allclose(outputs["OUTPUT0"], (a + b).ravel(), rtol=1e-6)
            np.testing.assert_allclose(outputs["OUTPUT1"], (a - b).ravel(), rtol=1e-6)
            assert outputs["ROWS"].tolist() == [len(a)] * len(a)
        stats = httpx.get(f"http://127.0.0.1:{port}/v2/models/add_sub/stats").json()
        batches = stats["model_stats"][0]["batch_stats"]
        assert [s["batch_size"] for s in batches] == [2, 6]

        # A request the model answers with an error fails alone: the batch is run again in
        # halves, and the others of its batch are answered.
        (a, b), bad_b = pairs[2], -pairs[0][1]
        good1, bad, good2 = asyncio.run(
            send_all([body(*pairs[1]), body(pairs[0][0], bad_b), body(a, b)])
        )
        assert bad.status_code == 400
        assert bad.json() == {"error": "INPUT1 must not be negative"}
        assert good1.status_code == good2.status_code == 200

        # The request's own parameters reach the model; the server's (timeout) do not.
        asked = {**body(*pairs[0]), "parameters": {"scale": 10, "timeout": 30_000_000}}
        (scaled,) = asyncio.run(send_all([asked]))
        rows = next(o for o in scaled.json()["outputs"] if o["name"] == "ROWS")
        assert rows["data"] == [10]
    # weir up stopped its worker, which finalized the model's instance.
    assert (tmp_path / "models" / "add_sub" / "finalized").read_text() == "done"


def test_calls_weir_does_not_serve_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bls, "CLIENT", None)  # no worker runs in this process
    with pytest.raises(pb_utils.TritonModelException, match="needs a Weir worker"):
        pb_utils.InferenceRequest(model_name="other", requested_output_names=["Y"]).exec()
    with pytest.raises(pb_utils.TritonModelException, match="needs a Weir worker"):
        pb_utils.InferenceRequest(model_name="other").exec(decoupled=True)
    with pytest.raises(pb_utils.TritonModelException, match="only a decoupled model"):
        pb_utils.InferenceRequest().get_response_sender()
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is object
    assert pb_utils.numpy_to_triton_type(np.float16) == "TYPE_FP16"


REPEAT_CONFIG = """
    backend: python
    max_batch_size: 4
    input: [{name: IN, data_type: TYPE_INT32, dims: [1]}]
    output: [{name: OUT, data_type: TYPE_INT32, dims: [1]}]
    model_transaction_policy: {decoupled: true}
"""
# Triton's decoupled pattern: execute hands each request to a thread of the model's own,
# which sends its responses after execute has returned, then the final flag alone.
REPEAT = """
    import threading

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                count = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0, 0])
                sender = request.get_response_sender()
                threading.Thread(target=self.repeat, args=(sender, count)).start()
            return None

        def repeat(self, sender, count):
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if count < 0:
                invalid = pb_utils.TritonError.INVALID_ARG
                error = pb_utils.TritonError("IN must not be negative", invalid)
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            for i in range(count):
                out = pb_utils.Tensor("OUT", np.array([[i]], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=final)
"""


def test_a_decoupled_triton_python_model_streams_from_its_own_threads(tmp_path: Path) -> None:
    import queue

    import tritonclient.grpc as grpcclient

    model = tmp_path / "models" / "repeat"
    (model / "1").mkdir(parents=True)
    (model / "config.yaml").write_text(textwrap.dedent(REPEAT_CONFIG))
    (model / "1" / "model.py").write_text(textwrap.dedent(REPEAT))
    http_port, grpc_port = free_port(), free_port()
    args = ["--repository", str(tmp_path / "models"), "--http-port", str(http_port)]
    args += ["--grpc-port", str(grpc_port), "--metrics-port", "0", "--redis-port", str(free_port())]

    def stream(count: int, empty_final: bool) -> list[tuple[int | None, bool | None, str]]:
        """Each response of one request: OUT (None: none), its final flag, its error."""
        got: queue.Queue[tuple[object, object]] = queue.Queue()
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[count]], np.int32))
        seen: list[tuple[int | None, bool | None, str]] = []
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            client.start_stream(callback=lambda result, error: got.put((result, error)))
            client.async_stream_infer(
                "repeat", [tensor], request_id="r", enable_empty_final_response=empty_final
            )
            expected = count + empty_final if count >= 0 else 1  # an error: one response
            while len(seen) < expected:
                result, error = got.get(timeout=30)
                if error is not None:
                    seen.append((None, None, str(error)))
                    continue
                response = result.get_response()  # type: ignore[attr-defined]
                out = result.as_numpy("OUT")  # type: ignore[attr-defined]
                final = response.parameters["triton_final_response"].bool_param
                seen.append(
                    (None if out is None else int(out[0, 0]), final if empty_final else None, "")
                )
            client.stop_stream()
        return seen

    with weir_up(*args):
        assert stream(3, empty_final=True) == [
            (0, False, ""), (1, False, ""), (2, False, ""), (None, True, "")
        ]  # fmt: skip
        assert stream(2, empty_final=False) == [(0, None, ""), (1, None, "")]
        ((_, _, error),) = stream(-1, empty_final=False)
        assert "IN must not be negative" in error
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}/v2/models/repeat") as client:
            events = client.post("/generate_stream", json={"IN": 3}, timeout=30).text
            assert events.count("data: ") == 3 and '"OUT":2' in events
            assert client.post("/generate", json={"IN": 2}, timeout=30).json()["OUT"] == 1


DOUBLE_CONFIG = """
    backend: python
    max_batch_size: 8
    input: [{name: X, data_type: TYPE_FP32, dims: [2]}]
    output: [{name: Y, data_type: TYPE_FP32, dims: [2]}]
"""
DOUBLE = """
    class Double:
        def initialize(self, context):
            pass

        def inference(self, batch):
            return {"Y": batch["X"] * 2}
"""
CALLER = """
    import asyncio

    import numpy as np
    import triton_python_backend_utils as pb_utils


    def call(model, x):
        return pb_utils.InferenceRequest(
            model_name=model, inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
        )


    class TritonPythonModel:
        async def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                if (x < 0).any():  # a call to a model there is not: its error, passed on
                    failed = call("missing", x).exec()
                    responses.append(pb_utils.InferenceResponse(error=failed.error()))
                    continue
                # Two calls at once, then one more with the first's answer.
                once, twice = await asyncio.gather(
                    call("double", x).async_exec(), call("double", x + 1).async_exec()
                )
                y = pb_utils.get_output_tensor_by_name(once, "Y").as_numpy()
                z = pb_utils.get_output_tensor_by_name(twice, "Y").as_numpy()
                again = call("double", y).exec()
                w = pb_utils.get_output_tensor_by_name(again, "Y").as_numpy()
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", w + z)]))
            return responses
"""


def test_a_triton_python_model_calls_other_models(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for name, handler in (("double", DOUBLE), ("caller", CALLER)):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.yaml").write_text(textwrap.dedent(DOUBLE_CONFIG))
        (models / name / "1" / "model.py").write_text(textwrap.dedent(handler))
    port = free_port()
    args = ["--repository", str(models), "--http-port", str(port)]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    with weir_up(*args), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        tensor = {"name": "X", "shape": [2, 2], "datatype": "FP32"}
        answer = client.post(
            "/v2/models/caller/infer", json={"inputs": [{**tensor, "data": x.ravel().tolist()}]}
        )
        assert answer.status_code == 200, answer.text
        # 2 * (2x) + 2 * (x + 1)
        assert answer.json()["outputs"][0]["data"] == (6 * x + 2).ravel().tolist()
        failed = client.post(
            "/v2/models/caller/infer", json={"inputs": [{**tensor, "data": (-x).ravel().tolist()}]}
        )
        assert failed.status_code == 404
        assert failed.json() == {"error": "Request for unknown model: 'missing' is not found"}
