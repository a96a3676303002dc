"""The PyTorch backend loads TorchScript and torch.export programs and binds inputs right."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from weir.config import ModelConfig
from weir.errors import ConfigError
from workers.backends import load_backend
from workers.threads import ThreadShare


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


def threads_config(parameters: dict[str, str]) -> ModelConfig:
    raw = config(["INPUT0"], ["OUTPUT0"]).model_dump()
    return ModelConfig.model_validate({**raw, "parameters": parameters})


def infer_in_thread(backend: object, x: np.ndarray) -> tuple[np.ndarray, int]:
    """Run one batch on a fresh thread; its result and that thread's torch thread count."""
    found: list[tuple[np.ndarray, int]] = []

    def run() -> None:
        out = backend.infer({"INPUT0": x})["OUTPUT0"]  # type: ignore[attr-defined]
        found.append((out, torch.get_num_threads()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return found[0]


def test_a_batch_gets_its_share_of_the_worker_threads(tmp_path: Path) -> None:
    torch.jit.script(Double()).save(str(tmp_path / "model.pt"))
    share = ThreadShare(4)
    backend = load_backend(threads_config({}), tmp_path, share)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out, alone = infer_in_thread(backend, x)
    np.testing.assert_array_equal(out, x * 2)
    assert alone == 4
    with share.computing():  # another instance's batch is running meanwhile
        _, beside = infer_in_thread(backend, x)
    assert beside == 2


def test_intra_op_thread_count_applies_to_the_calling_thread_only(tmp_path: Path) -> None:
    torch.jit.script(Double()).save(str(tmp_path / "model.pt"))
    before = torch.get_num_threads()
    wanted = before + 1
    backend = load_backend(threads_config({"INTRA_OP_THREAD_COUNT": str(wanted)}), tmp_path)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out, threads = infer_in_thread(backend, x)
    np.testing.assert_array_equal(out, x * 2)
    assert threads == wanted
    assert torch.get_num_threads() == before  # this thread's count is its own


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_intra_op_thread_count_is_a_config_error(tmp_path: Path, value: str) -> None:
    torch.jit.script(Double()).save(str(tmp_path / "model.pt"))
    with pytest.raises(ConfigError, match="INTRA_OP_THREAD_COUNT"):
        load_backend(threads_config({"INTRA_OP_THREAD_COUNT": value}), tmp_path)


def test_instances_can_share_one_module_across_threads(tmp_path: Path) -> None:
    # Worker instances of a torch model share one loaded module: concurrent calls from their
    # threads must each get their own batch's answer.
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    torch.jit.script(layer).save(str(tmp_path / "model.pt"))
    backend = load_backend(config(["INPUT0"], ["OUTPUT0"]), tmp_path)
    assert backend.shareable
    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((5, 4), dtype=np.float32) for _ in range(8)]
    with torch.inference_mode():
        expected = [layer(torch.from_numpy(b)).numpy() for b in batches]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(25):
            outs = list(pool.map(lambda b: backend.infer({"INPUT0": b})["OUTPUT0"], batches))
            for out, want in zip(outs, expected, strict=True):
                np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("filename", ["doubler.pt", "doubler.pt2"])
def test_default_model_filename_names_the_model_file(tmp_path: Path, filename: str) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    if filename.endswith(".pt2"):
        program = torch.export.export(Double(), (torch.from_numpy(x),))
        torch.export.save(program, str(tmp_path / filename))
    else:
        torch.jit.script(Double()).save(str(tmp_path / filename))
    named = config(["INPUT0"], ["OUTPUT0"]).model_copy(update={"default_model_filename": filename})
    backend = load_backend(named, tmp_path)
    np.testing.assert_array_equal(backend.infer({"INPUT0": x})["OUTPUT0"], x * 2)


def test_a_missing_default_model_filename_is_named(tmp_path: Path) -> None:
    torch.jit.script(Double()).save(str(tmp_path / "model.pt"))
    named = config(["INPUT0"], ["OUTPUT0"]).model_copy(update={"default_model_filename": "x.pt"})
    with pytest.raises(ConfigError, match=r"no x\.pt \(default_model_filename\)"):
        load_backend(named, tmp_path)
