"""Decoupled models: several responses a request over gRPC streaming, as Triton serves them.

``weir up`` serves a Python model with ``model_transaction_policy { decoupled: true }``
whose handler sends each request ``COUNT`` responses with ``context.send_part`` before its
answer. ``tritonclient.grpc`` reads them from ``ModelStreamInfer`` unmodified, with
Triton's ``triton_final_response`` flag on each; ``ModelInfer`` and HTTP's infer refuse the
model as Triton does. The same handler in a model that is not decoupled fails its request.
"""

from __future__ import annotations

import json
import queue
import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gateway.generate import generate_body
from tests.conftest import free_port
from tests.weir_up import weir_up
from weir.config import ModelConfig
from weir.errors import InvalidInput

CONFIG = """
    backend: python
    max_batch_size: 8
    input: [{name: COUNT, data_type: TYPE_INT32, dims: [1]}]
    output: [{name: OUT, data_type: TYPE_INT32, dims: [1]}]
"""
DECOUPLED = "model_transaction_policy: {decoupled: true}\n"
COUNTER = """
    import numpy as np


    class Counter:
        def initialize(self, context):
            self.context = context

        def inference(self, batch):
            counts = batch["COUNT"][:, 0]
            for step in range(int(counts.max())):
                for row, count in enumerate(counts):
                    if step < count:
                        self.context.send_part(row, {"OUT": np.array([[step]], np.int32)})
            return {"OUT": (counts * 100).reshape(-1, 1)}
"""


SHOUT_CONFIG = """
    backend: python
    max_batch_size: 4
    input: [{name: text_input, data_type: TYPE_STRING, dims: [1]}]
    output: [{name: text_output, data_type: TYPE_STRING, dims: [1]}]
    model_transaction_policy: {decoupled: true}
"""
SHOUT = """
    import numpy as np


    class Shout:
        def initialize(self, context):
            self.context = context

        def inference(self, batch):
            texts = [t.decode() for t in batch["text_input"][:, 0]]
            for row, text in enumerate(texts):
                for word in text.split():
                    self.context.send_part(row, {"text_output": [[word.upper().encode()]]})
            return {"text_output": np.array([[b"!"]] * len(texts), dtype=object)}
"""


def write_model(root: Path, name: str, config: str, handler: str = COUNTER) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(handler))


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    repository = tmp_path / "models"
    write_model(repository, "counter", CONFIG + "    " + DECOUPLED)
    write_model(repository, "chatty", CONFIG)
    write_model(repository, "shout", SHOUT_CONFIG, SHOUT)
    http_port, grpc_port = free_port(), free_port()
    args = ["--repository", str(repository), "--http-port", str(http_port)]
    args += ["--grpc-port", str(grpc_port), "--metrics-port", "0", "--redis-port", str(free_port())]
    with weir_up(*args):
        yield http_port, grpc_port


def count_input(count: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("COUNT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[count]], np.int32))
    return tensor


def test_each_response_of_a_decoupled_model_is_streamed(served: tuple[int, int]) -> None:
    http_port, grpc_port = served
    responses: queue.Queue[tuple[object, object]] = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        config = client.get_model_config("counter", as_json=True)["config"]
        assert config["model_transaction_policy"] == {"decoupled": True}
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for request_id, count in (("three", 3), ("none", 0)):
            client.async_stream_infer(
                "counter", [count_input(count)], request_id=request_id,
                enable_empty_final_response=True,
            )  # fmt: skip
        seen: dict[str, list[tuple[int, bool]]] = {"three": [], "none": []}
        while not all(steps and steps[-1][1] for steps in seen.values()):
            result, error = responses.get(timeout=30)
            assert error is None, error
            response = result.get_response()  # type: ignore[attr-defined]
            final = response.parameters["triton_final_response"].bool_param
            value = int(result.as_numpy("OUT")[0, 0])  # type: ignore[attr-defined]
            seen[response.id].append((value, final))
        client.stop_stream()
    assert seen == {"three": [(0, False), (1, False), (2, False), (300, True)], "none": [(0, True)]}

    # One response per request: the endpoints refuse the model, with Triton's words.
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("counter", [count_input(1)])
        assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "decoupled transaction policy" in str(refused.value.message())
    body = {"inputs": [{"name": "COUNT", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}
    answer = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/counter/infer", json=body)
    assert answer.status_code == 501
    assert answer.json() == {
        "error": "HTTP end point doesn't support models with decoupled transaction policy"
    }

    # A model that is not decoupled cannot send parts: its request fails and says why.
    chatty = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/chatty/infer", json=body)
    assert chatty.status_code == 500
    assert "not decoupled" in chatty.json()["error"]
    body["inputs"][0]["data"] = [0]  # no part sent: answered as ever
    quiet = httpx.post(f"http://127.0.0.1:{http_port}/v2/models/chatty/infer", json=body)
    assert quiet.json()["outputs"][0]["data"] == [0]


def events(response: httpx.Response) -> list[object]:
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = response.text.split("\n\n")
    assert chunks[-1] == "" and all(c.startswith("data: ") for c in chunks[:-1])
    return [json.loads(c.removeprefix("data: ")) for c in chunks[:-1]]


def test_the_generate_extension_answers_and_streams(served: tuple[int, int]) -> None:
    http_port, _ = served
    with httpx.Client(base_url=f"http://127.0.0.1:{http_port}/v2/models", timeout=30) as client:
        streamed = client.post("/shout/generate_stream", json={"text_input": "hello weir"})
        assert streamed.status_code == 200
        assert events(streamed) == [
            {"model_name": "shout", "model_version": "1", "text_output": "HELLO"},
            {"model_name": "shout", "model_version": "1", "text_output": "WEIR"},
            {"model_name": "shout", "model_version": "1", "text_output": "!"},
        ]
        # /generate answers with the last response; an input may come under "parameters",
        # and a key that is no input is a parameter.
        whole = client.post(
            "/counter/versions/1/generate",
            json={"parameters": {"COUNT": 2, "temperature": 0.5}, "stream": False},
        )
        assert whole.json() == {"model_name": "counter", "model_version": "1", "OUT": 200}
        # A model that is not decoupled streams its one answer.
        assert events(client.post("/chatty/generate_stream", json={"COUNT": [0]})) == [
            {"model_name": "chatty", "model_version": "1", "OUT": 0}
        ]
        # Failures before the first response are plain JSON errors with their status.
        failed = client.post("/chatty/generate_stream", json={"COUNT": 1})
        assert failed.status_code == 500 and "not decoupled" in failed.json()["error"]
        bad = client.post("/counter/generate", json={"COUNT": 1, "extra": [1, 2]})
        assert bad.status_code == 400
        assert "'extra' is no input of model 'counter'" in bad.json()["error"]
        # Two elements of a [-1, 1] input: a batch of two, as Triton shapes it.
        batch = client.post("/counter/generate", json={"COUNT": [1, 2]})
        assert batch.json()["OUT"] == [100, 200]
        assert client.post("/nothing/generate", json={}).status_code == 404


def test_generate_shapes_values_as_triton_does() -> None:
    config = ModelConfig.model_validate(
        {
            "name": "pairs",
            "backend": "python",
            "max_batch_size": 4,
            "input": [
                {"name": "PAIR", "data_type": "TYPE_FP32", "dims": [2]},
                {"name": "WORDS", "data_type": "TYPE_STRING", "dims": [-1]},
            ],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        }
    )
    body = generate_body(config, b'{"PAIR": [1, 2, 3, 4], "WORDS": ["a", "b", "c"], "k": 1}')
    assert body.inputs["PAIR"].shape == (2, 2)  # the fixed dimension first, then the batch
    assert body.inputs["WORDS"].shape == (1, 3)  # the innermost variable one takes the rest
    assert body.parameters == {"k": 1}
    with pytest.raises(InvalidInput, match="can not convert input 'PAIR'"):
        generate_body(config, b'{"PAIR": [1, 2, 3]}')
    with pytest.raises(InvalidInput, match="not JSON"):
        generate_body(config, b"{")
