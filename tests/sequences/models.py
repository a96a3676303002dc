"""Sequence models for the tests, written into a repository: Python, TorchScript and ONNX.

Each is an accumulator: its output is the sum of its sequence's inputs so far, carried in
implicit state (``INPUT_STATE`` in, ``OUTPUT_STATE`` out) and restarted by ``START``.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import torch

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""

PYTHON_CONFIG = f"""
name: "py_acc"
backend: "python"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: {{idle_us}}
  oldest {{
    max_candidate_sequences: 16 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000
  }}
  {CONTROLS}
  state [
    {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [
  {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "CORR" data_type: TYPE_UINT64 dims: [ 1 ] }},
  {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}
]
"""

PYTHON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value, start = tensor(request, "INPUT"), tensor(request, "START")
            total = value + np.where(start == 1, 0, tensor(request, "INPUT_STATE"))
            assert tensor(request, "READY").item() == 1
            assert tensor(request, "END").item() == (request.flags() & 2) // 2
            assert tensor(request, "CORRID").item() == request.correlation_id()
            outputs = {
                "OUTPUT": total,
                "OUTPUT_STATE": total,
                "CORR": tensor(request, "CORRID"),
                "FLAGS": np.array([[request.flags()]], np.int32),
                "BATCH": np.array([[len(requests)]], np.int32),
            }
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, array) for name, array in outputs.items()]
            ))
        return responses
"""

RUNTIME_CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 8
sequence_batching {{
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{
    input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: [ 2 ]
    initial_state: {{ data_type: TYPE_FP32 dims: [ 2 ] zero_data: true name: "zeros" }}
  }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
"""


TEXT_CONFIG = """
name: "py_text"
backend: "python"
max_batch_size: 0
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "SEEN" output_name: "SEEN_OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
}
input [ { name: "WORD" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ID" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# Strings, unbatched: the words of the sequence so far, kept as a state of variable length.
TEXT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def tensor(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy()


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seen = [] if tensor(request, "START")[0] else list(tensor(request, "SEEN"))
            words = seen + [tensor(request, "WORD")[0]]
            outputs = {
                "TEXT": np.array([b" ".join(words)], dtype=object),
                "ID": tensor(request, "CORRID"),
                "SEEN_OUT": np.array(words, dtype=object),
            }
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, array) for name, array in outputs.items()]
            ))
        return responses
"""

PIPELINE_CONFIG = """
name: "acc_pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOTAL" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ {
  model_name: "py_acc" model_version: -1
  input_map { key: "INPUT" value: "X" }
  output_map { key: "OUTPUT" value: "TOTAL" }
} ] }
"""


class Accumulator(torch.nn.Module):
    """The sum so far: the input, plus the state unless the sequence starts here."""

    def forward(
        self,
        INPUT: torch.Tensor,
        START: torch.Tensor,
        INPUT_STATE: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = INPUT + INPUT_STATE * (1 - START)
        return total, total


def write_repository(root: Path, idle_us: int = 2_000_000) -> Path:
    """The three accumulators under ``root``."""
    python = root / "py_acc"
    (python / "1").mkdir(parents=True)
    (python / "config.pbtxt").write_text(PYTHON_CONFIG.replace("{idle_us}", str(idle_us)))
    (python / "1" / "model.py").write_text(textwrap.dedent(PYTHON_MODEL))
    text = root / "py_text"
    (text / "1").mkdir(parents=True)
    (text / "config.pbtxt").write_text(TEXT_CONFIG)
    (text / "1" / "model.py").write_text(textwrap.dedent(TEXT_MODEL))
    (root / "acc_pipeline" / "1").mkdir(parents=True)
    (root / "acc_pipeline" / "config.pbtxt").write_text(PIPELINE_CONFIG)
    module = Accumulator().eval()
    torch_dir = root / "torch_acc"
    (torch_dir / "1").mkdir(parents=True)
    (torch_dir / "config.pbtxt").write_text(
        RUNTIME_CONFIG.format(name="torch_acc", backend="pytorch")
    )
    torch.jit.script(module).save(str(torch_dir / "1" / "model.pt"))
    onnx_dir = root / "onnx_acc"
    (onnx_dir / "1").mkdir(parents=True)
    (onnx_dir / "config.pbtxt").write_text(
        RUNTIME_CONFIG.format(name="onnx_acc", backend="onnxruntime")
    )
    example = (torch.ones(1, 2), torch.ones(1, 1), torch.ones(1, 2))
    batch = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter is deprecated
        torch.onnx.export(
            module,
            example,
            str(onnx_dir / "1" / "model.onnx"),
            input_names=["INPUT", "START", "INPUT_STATE"],
            output_names=["OUTPUT", "OUTPUT_STATE"],
            dynamic_axes={
                n: batch for n in ("INPUT", "START", "INPUT_STATE", "OUTPUT", "OUTPUT_STATE")
            },
            opset_version=17,
            dynamo=False,
        )
    return root
