"""A Triton Python model whose ``config.pbtxt`` says only ``backend: "python"``, served.

``weir up`` reads the repository in each of its services; each completes the config by the
model's ``auto_complete_config``, so the gateway validates against the model's inputs, the
batcher batches by its ``max_batch_size`` and the worker runs it, and ``tritonclient`` sees
the completed config.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import free_port
from tests.weir_up import weir_up

MODEL = """
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(auto_complete_model_config):
            config = auto_complete_model_config
            config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3]})
            config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]})
            config.set_max_batch_size(4)
            config.set_dynamic_batching()
            return config

        def execute(self, requests):
            responses = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
                out = pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
"""


def test_a_one_line_config_is_completed_and_served(tmp_path: Path) -> None:
    version = tmp_path / "models" / "doubler" / "1"
    version.mkdir(parents=True)
    (version.parent / "config.pbtxt").write_text('backend: "python"\n')
    (version / "model.py").write_text(textwrap.dedent(MODEL))
    port = free_port()
    args = ["--repository", str(tmp_path / "models"), "--http-port", str(port)]
    args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]
    with weir_up(*args), httpclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        config = client.get_model_config("doubler")
        assert config["max_batch_size"] == 4
        assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
            ("INPUT0", "TYPE_FP32", [3])
        ]
        assert "dynamic_batching" in config
        rows = np.arange(6, dtype=np.float32).reshape(2, 3)
        given = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        given.set_data_from_numpy(rows)
        answer = client.infer("doubler", [given]).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(answer, rows * 2)
        too_many = httpclient.InferInput("INPUT0", [5, 3], "FP32")
        too_many.set_data_from_numpy(np.zeros((5, 3), np.float32))
        with pytest.raises(httpclient.InferenceServerException) as refused:
            client.infer("doubler", [too_many])
        assert refused.value.status() == "400" and "batch" in str(refused.value)
