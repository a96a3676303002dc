"""The PyTorch backend loads TorchScript and torch.export programs and binds inputs right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from weir.config import ModelConfig
from weir.errors import ConfigError
from workers.backends import load_backend


class AddSub(torch.nn.Module):
    def forward(self, B: torch.Tensor, A: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"SUM": A + 2 * B, "DIFF": A - B}


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def config(inputs: list[str], outputs: list[str]) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "m",
            "backend": "pytorch",
            "max_batch_size": 8,
            "input": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in inputs],
            "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [4]} for n in outputs],
        }
    )


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n: rng.standard_normal((3, 4), dtype=np.float32) for n in ("A", "B")}


def test_torchscript_inputs_bind_to_forward_arguments_by_name(tmp_path: Path) -> None:
    torch.jit.script(AddSub()).save(str(tmp_path / "model.pt"))
    backend = load_backend(config(["A", "B"], ["DIFF", "SUM"]), tmp_path)
    inputs = arrays()
    out = backend.infer(inputs)
    np.testing.assert_allclose(out["SUM"], inputs["A"] + 2 * inputs["B"], rtol=1e-6)
    np.testing.assert_allclose(out["DIFF"], inputs["A"] - inputs["B"], rtol=1e-6)


def test_torchscript_inputs_bind_in_config_order_when_names_differ(tmp_path: Path) -> None:
    torch.jit.script(Double()).save(str(tmp_path / "model.pt"))
    backend = load_backend(config(["INPUT0"], ["OUTPUT0"]), tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(backend.infer({"INPUT0": x})["OUTPUT0"], x * 2)


def test_torch_export_program_loads_with_a_dynamic_batch(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", max=8)
    example = (torch.randn(2, 4), torch.randn(2, 4))
    program = torch.export.export(
        AddSub(), example, dynamic_shapes={"B": {0: batch}, "A": {0: batch}}
    )
    torch.export.save(program, str(tmp_path / "model.pt2"))
    backend = load_backend(config(["A", "B"], ["SUM", "DIFF"]), tmp_path)
    inputs = arrays()
    out = backend.infer(inputs)
    np.testing.assert_allclose(out["SUM"], inputs["A"] + 2 * inputs["B"], rtol=1e-6)


def test_missing_model_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.pt"):
        load_backend(config(["A"], ["SUM"]), tmp_path)


def test_forward_arity_that_disagrees_with_config_is_a_config_error(tmp_path: Path) -> None:
    torch.jit.script(AddSub()).save(str(tmp_path / "model.pt"))
    with pytest.raises(ConfigError, match="forward\\(\\) takes 2 inputs"):
        load_backend(config(["X"], ["SUM"]), tmp_path)
