"""Decoupled calls from a Triton Python model to another (``exec(decoupled=True)``).

A model iterates a decoupled model's responses as they come, through ``weir up``'s mesh:
every response, then the empty last one; an error ends the stream; a decoupled model called
without ``decoupled=True`` is refused, as in Triton; ``cancel()`` reaches the called model
(its ``is_cancelled()``), which stops.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_until
from tests.weir_up import weir_up
from tests.workers.test_triton_python import REPEAT, REPEAT_CONFIG

TICKER = """
    import threading
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.repository = args["model_repository"]

        def execute(self, requests):
            for request in requests:
                sender = request.get_response_sender()
                threading.Thread(target=self.tick, args=(sender,)).start()

        def tick(self, sender):
            sent = 0
            while not sender.is_cancelled() and sent < 1000:
                out = pb_utils.Tensor("OUT", np.array([[sent]], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sent += 1
                time.sleep(0.02)
            with open(self.repository + "/stopped", "w") as mark:
                mark.write(str(sent))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
CALLER_CONFIG = """
    backend: python
    max_batch_size: 0
    input: [{name: N, data_type: TYPE_INT32, dims: [1]}]
    output:
      - {name: COUNT, data_type: TYPE_INT32, dims: [1]}
      - {name: SUM, data_type: TYPE_INT32, dims: [1]}
"""
CALLER = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    def call(model, n):
        tensor = pb_utils.Tensor("IN", np.array([[n]], np.int32))
        return pb_utils.InferenceRequest(
            model_name=model, inputs=[tensor], requested_output_names=["OUT"]
        )


    def answer(count, total):
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("COUNT", np.array([count], np.int32)),
            pb_utils.Tensor("SUM", np.array([total], np.int32)),
        ])


    class TritonPythonModel:
        async def execute(self, requests):
            n = int(pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()[0])
            if n == -2:  # a decoupled model called as if it were not
                return [pb_utils.InferenceResponse(error=call("repeat", 1).exec().error())]
            if n == -3:  # take three of the ticker's responses, then cancel
                stream = call("ticker", 0).exec(decoupled=True)
                taken = []
                for response in stream:
                    taken.append(int(pb_utils.get_output_tensor_by_name(response, "OUT")
                                     .as_numpy()[0, 0]))
                    if len(taken) == 3:
                        stream.cancel()
                return [answer(len(taken), sum(taken))]
            stream = (
                call("repeat", n).exec(decoupled=True) if n < 0
                else await call("repeat", n).async_exec(decoupled=True)
            )
            count, total = 0, 0
            for response in stream:
                if response.has_error():
                    return [pb_utils.InferenceResponse(error=response.error())]
                count += 1
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:  # the last response is empty
                    total += int(out.as_numpy()[0, 0])
            return [answer(count, total)]
"""


def test_a_model_iterates_a_decoupled_models_responses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every batch that is quick enough would run in the worker's event loop: a Python model's
    # never does, as its calls to other models (and an async execute) wait on that loop.
    monkeypatch.setenv("WEIR_WORKER_INLINE_BLOCK_US", str(60_000_000))
    models = tmp_path / "models"
    for name, config, model in (
        ("repeat", REPEAT_CONFIG, REPEAT),
        ("ticker", REPEAT_CONFIG, TICKER),
        ("caller", CALLER_CONFIG, CALLER),
    ):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.yaml").write_text(textwrap.dedent(config))
        (models / name / "1" / "model.py").write_text(textwrap.dedent(model))
    port = free_port()
    args = ["--repository", str(models), "--http-port", str(port)]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]

    def ask(client: httpx.Client, n: int) -> httpx.Response:
        body = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [n]}]}
        return client.post("/v2/models/caller/infer", json=body)

    def counted(answer: httpx.Response) -> tuple[int, int]:
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o["data"][0] for o in answer.json()["outputs"]}
        return outputs["COUNT"], outputs["SUM"]

    with weir_up(*args), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        assert counted(ask(client, 4)) == (5, 0 + 1 + 2 + 3)  # four responses, the empty last
        assert counted(ask(client, 0)) == (1, 0)
        failed = ask(client, -1)
        assert failed.status_code == 400 and "IN must not be negative" in failed.text
        refused = ask(client, -2)
        assert refused.status_code == 501, refused.text
        assert "decoupled=True" in refused.json()["error"]
        assert counted(ask(client, -3)) == (3, 0 + 1 + 2)
        stopped = models / "ticker" / "stopped"
        wait_until(stopped.exists, 10, "the cancelled ticker to stop")
        assert int(stopped.read_text()) < 1000
