"""Decoupled models: several responses a request over gRPC streaming, as Triton serves them.

``weir up`` serves a Python model with ``model_transaction_policy { decoupled: true }``
whose handler sends each request ``COUNT`` responses with ``context.send_part`` before its
answer. ``tritonclient.grpc`` reads them from ``ModelStreamInfer`` unmodified, with
Triton's ``triton_final_response`` flag on each; ``ModelInfer`` and HTTP's infer refuse the
model as Triton does. The same handler in a model that is not decoupled fails its request.
"""

from __future__ import annotations

import queue
import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import free_port
from tests.weir_up import weir_up

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


def write_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(COUNTER))


@pytest.fixture
def served(tmp_path: Path):  # type: ignore[no-untyped-def]
    repository = tmp_path / "models"
    write_model(repository, "counter", CONFIG + "    " + DECOUPLED)
    write_model(repository, "chatty", CONFIG)
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
