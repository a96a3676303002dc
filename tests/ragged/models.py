"""A ragged model for the tests, in three runtimes: per-request sums of a ragged input.

``INPUT`` comes as every request's elements concatenated; ``INDEX`` (a batch input, where
each request ends) splits it. ``SUM`` is each request's sum, ``COUNT`` the requests in the
batch, and ``DOUBLED`` (a batch output) each element doubled, scattered back by ``INPUT``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 16
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
batch_input [ {{
  kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_FP32
  source_input: "INPUT"
}} ]
output [
  {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "COUNT" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_output [ {{
  target_name: "DOUBLED" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT"
}} ]
"""


class SegmentSum(torch.nn.Module):
    """Each request's sum, from the running sum at each request's end."""

    def forward(
        self, INPUT: torch.Tensor, INDEX: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        running = torch.cumsum(INPUT, 0)
        at_end = running[INDEX.long() - 1]
        before = torch.cat([torch.zeros(1), at_end[:-1]])
        count = torch.ones_like(at_end) * torch.ones_like(INDEX).sum()
        return (at_end - before).unsqueeze(1), count.unsqueeze(1), INPUT * 2


def write_repository(root: Path) -> Path:
    """The model for each runtime: TorchScript, ONNX, and OpenVINO IR converted from it."""
    import openvino as ov

    module = SegmentSum().eval()
    backends = (("ragged_torch", "pytorch"), ("ragged_onnx", "onnxruntime"))
    for name, backend in (*backends, ("ragged_openvino", "openvino")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, backend=backend))
    torch.jit.script(module).save(str(root / "ragged_torch" / "1" / "model.pt"))
    example = (torch.ones(5), torch.tensor([2.0, 5.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter is deprecated
        torch.onnx.export(
            module,
            example,
            str(root / "ragged_onnx" / "1" / "model.onnx"),
            input_names=["INPUT", "INDEX"],
            output_names=["SUM", "COUNT", "DOUBLED"],
            dynamic_axes={n: {0: "n"} for n in ("INPUT", "INDEX", "SUM", "COUNT", "DOUBLED")},
            opset_version=17,
            dynamo=False,
        )
    converted = ov.convert_model(str(root / "ragged_onnx" / "1" / "model.onnx"))
    ov.save_model(converted, str(root / "ragged_openvino" / "1" / "model.xml"))
    return root
