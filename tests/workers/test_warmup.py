"""A model instance runs its model_warmup samples through the batch path before it serves.

Real backends and real files: the example models (torch, ONNX Runtime from a config.pbtxt,
the python tokenizer), and python handlers written here that record what they were given
or fail.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weir import datatypes
from weir.config import ModelConfig, config_from_raw, read_yaml
from weir.pbtxt import load_pbtxt
from workers.backends import load_backend
from workers.execution import BatchRunner
from workers.warmup import WarmupError, run_warmup

RECORDER = '''
import numpy as np

class Recorder:
    """Keeps a copy of every batch it runs; answers each row with the batch's rows."""

    def initialize(self, context):
        self.batching = context.config.max_batch_size > 0
        self.seen = []

    def inference(self, batch):
        self.seen.append({name: array.copy() for name, array in batch.items()})
        rows = len(batch["VALUES"]) if self.batching else 1
        shape = (rows, 1) if self.batching else (1,)
        return {"ROWS": np.full(shape, rows, dtype=np.int32)}
'''

BROKEN = """
class Broken:
    def initialize(self, context):
        pass

    def inference(self, batch):
        raise RuntimeError("no kernel for this shape")
"""


def recorder_config(warmup: list[dict[str, Any]], max_batch_size: int = 8) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "recorder",
            "backend": "python",
            "max_batch_size": max_batch_size,
            "input": [
                {"name": "VALUES", "data_type": "TYPE_FP32", "dims": [3]},
                {"name": "FLAGS", "data_type": "TYPE_BOOL", "dims": [2]},
                {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]},
                {"name": "IDS", "data_type": "TYPE_INT64", "dims": [2]},
            ],
            "output": [{"name": "ROWS", "data_type": "TYPE_INT32", "dims": [1]}],
            "model_warmup": warmup,
        }
    )


def every_input(source: str) -> dict[str, Any]:
    return {
        "VALUES": {"data_type": "TYPE_FP32", "dims": [3], source: True},
        "FLAGS": {"data_type": "TYPE_BOOL", "dims": [2], source: True},
        "TEXT": {"data_type": "TYPE_STRING", "dims": [2], source: True},
        "IDS": {"data_type": "TYPE_INT64", "dims": [2], source: True},
    }


def python_model(tmp_path: Path, config: ModelConfig, source: str) -> tuple[BatchRunner, Path]:
    """The runner of ``source`` as ``config``'s model, and its model directory."""
    model_dir = tmp_path / config.name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(source))
    return BatchRunner(config, load_backend(config, model_dir / "1")), model_dir


def seen(runner: BatchRunner) -> list[dict[str, np.ndarray]]:
    return runner.backend.handler.seen  # type: ignore[attr-defined, no-any-return]


def warmup_file(model_dir: Path, name: str, data: bytes) -> None:
    (model_dir / "warmup").mkdir(parents=True, exist_ok=True)
    (model_dir / "warmup" / name).write_bytes(data)


def example_config(repository: Path, name: str, warmup: list[dict[str, Any]]) -> ModelConfig:
    """The example model's committed config.yaml, with ``warmup`` as its model_warmup."""
    path = repository / name / "config.yaml"
    return config_from_raw({**read_yaml(path), "model_warmup": warmup}, path, name)


# --- what a sample sends -------------------------------------------------------------------


def test_zero_data_runs_one_batch_of_batch_size_rows_of_zeros(tmp_path: Path) -> None:
    config = recorder_config(
        [{"name": "zeros", "batch_size": 4, "inputs": every_input("zero_data")}]
    )
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    run_warmup(config, runner, model_dir)

    (batch,) = seen(runner)
    assert batch["VALUES"].shape == (4, 3)
    assert batch["VALUES"].dtype == np.float32
    assert not batch["VALUES"].any()
    assert batch["FLAGS"].dtype == np.bool_
    assert not batch["FLAGS"].any()
    assert batch["IDS"].dtype == np.int64
    assert not batch["IDS"].any()
    assert batch["TEXT"].shape == (4, 2)
    assert batch["TEXT"].reshape(-1).tolist() == [b""] * 8  # Triton's zero data for strings


def test_random_data_is_seeded_values_of_each_datatype_repeated_on_every_row(
    tmp_path: Path,
) -> None:
    config = recorder_config(
        [{"name": "random", "batch_size": 3, "count": 2, "inputs": every_input("random_data")}]
    )
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    run_warmup(config, runner, model_dir)

    first, second = seen(runner)
    values = first["VALUES"]
    assert values.dtype == np.float32
    assert ((values >= 0) & (values < 1)).all()
    assert len(set(values[0].tolist())) == 3  # random, not a constant
    assert (values == values[0]).all()  # every row holds the same sample, as in Triton
    assert first["FLAGS"].dtype == np.bool_
    assert ((first["IDS"] >= 0) & (first["IDS"] < 100)).all()
    texts = first["TEXT"].reshape(-1).tolist()
    assert all(1 <= len(text) <= 8 and text.isascii() and text.isalnum() for text in texts)
    for name in ("VALUES", "FLAGS", "TEXT", "IDS"):  # seeded: the same data every run
        np.testing.assert_array_equal(first[name], second[name])


def test_input_data_file_is_one_row_read_from_the_model_warmup_folder(tmp_path: Path) -> None:
    inputs = {
        "VALUES": {"data_type": "TYPE_FP32", "dims": [3], "input_data_file": "values.bin"},
        "FLAGS": {"data_type": "TYPE_BOOL", "dims": [2], "input_data_file": "flags.bin"},
        "TEXT": {"data_type": "TYPE_STRING", "dims": [3], "input_data_file": "text.bin"},
        "IDS": {"data_type": "TYPE_INT64", "dims": [2], "zero_data": True},
    }
    config = recorder_config([{"name": "files", "batch_size": 2, "inputs": inputs}])
    runner, model_dir = python_model(tmp_path, config, RECORDER)
    warmup_file(model_dir, "values.bin", np.array([1.5, -2, 3, 99], "<f4").tobytes())
    warmup_file(model_dir, "flags.bin", bytes([1, 0]))
    warmup_file(model_dir, "text.bin", datatypes.serialize_bytes([b"a", b"", "é".encode()]))

    run_warmup(config, runner, model_dir)

    (batch,) = seen(runner)
    # A longer file gives its first bytes, as Triton reads it.
    np.testing.assert_array_equal(batch["VALUES"], [[1.5, -2, 3], [1.5, -2, 3]])
    np.testing.assert_array_equal(batch["FLAGS"], [[True, False], [True, False]])
    assert batch["TEXT"].tolist() == [[b"a", b"", "é".encode()]] * 2


def test_a_model_that_does_not_batch_gets_the_dims_without_a_batch_dimension(
    tmp_path: Path,
) -> None:
    config = recorder_config(
        [{"name": "plain", "batch_size": 1, "inputs": every_input("zero_data")}], max_batch_size=0
    )
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    run_warmup(config, runner, model_dir)

    (batch,) = seen(runner)
    assert batch["VALUES"].shape == (3,)
    assert batch["TEXT"].shape == (2,)


# --- count, skipping, logging --------------------------------------------------------------


def test_each_sample_runs_count_times_and_count_zero_runs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = recorder_config(
        [
            {"name": "thrice", "batch_size": 2, "count": 3, "inputs": every_input("zero_data")},
            {"name": "once", "batch_size": 5, "inputs": every_input("random_data")},
        ]
    )
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    with caplog.at_level(logging.INFO, logger="workers.warmup"):
        run_warmup(config, runner, model_dir)

    assert [len(batch["VALUES"]) for batch in seen(runner)] == [2, 2, 2, 5]
    assert "model recorder warmed up: 2 samples, 4 runs in " in caplog.text


def test_a_sample_with_batch_size_zero_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = recorder_config([{"name": "unsized", "inputs": every_input("zero_data")}])
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    with caplog.at_level(logging.WARNING, logger="workers.warmup"):
        run_warmup(config, runner, model_dir)

    assert seen(runner) == []
    assert "model recorder warm-up 'unsized' has batch_size 0 and is skipped" in caplog.text


def test_a_model_without_warmup_runs_nothing(tmp_path: Path) -> None:
    config = recorder_config([])
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    run_warmup(config, runner, model_dir)

    assert seen(runner) == []


# --- failures ------------------------------------------------------------------------------


def test_a_failing_model_fails_the_warm_up_with_the_models_reason(tmp_path: Path) -> None:
    config = recorder_config(
        [{"name": "w", "batch_size": 8, "count": 5, "inputs": every_input("zero_data")}]
    )
    runner, model_dir = python_model(tmp_path, config, BROKEN)

    with pytest.raises(WarmupError) as info:
        run_warmup(config, runner, model_dir)

    message = str(info.value)
    assert message.startswith("model 'recorder' warm-up 'w' failed: ")
    assert "RuntimeError: no kernel for this shape" in message
    assert "Traceback" not in message
    assert (info.value.model, info.value.sample) == ("recorder", "w")


def test_a_missing_data_file_fails_the_warm_up_naming_the_file(tmp_path: Path) -> None:
    inputs = {
        **every_input("zero_data"),
        "IDS": {"data_type": "INT64", "dims": [2], "input_data_file": "ids.bin"},
    }
    config = recorder_config([{"name": "w", "batch_size": 1, "inputs": inputs}])
    runner, model_dir = python_model(tmp_path, config, RECORDER)

    with pytest.raises(WarmupError) as info:
        run_warmup(config, runner, model_dir)

    assert str(info.value).startswith("model 'recorder' warm-up 'w' failed: cannot read ")
    assert str(model_dir / "warmup" / "ids.bin") in str(info.value)
    assert seen(runner) == []


def test_a_short_data_file_fails_the_warm_up_with_the_sizes(tmp_path: Path) -> None:
    inputs = {
        **every_input("zero_data"),
        "IDS": {"data_type": "INT64", "dims": [2], "input_data_file": "ids.bin"},
    }
    config = recorder_config([{"name": "w", "batch_size": 1, "inputs": inputs}])
    runner, model_dir = python_model(tmp_path, config, RECORDER)
    warmup_file(model_dir, "ids.bin", np.array([7], "<i8").tobytes())

    with pytest.raises(WarmupError, match=r"ids\.bin holds 8 bytes; INT64 \[2\] needs 16"):
        run_warmup(config, runner, model_dir)


def test_a_strings_file_with_the_wrong_element_count_fails_the_warm_up(tmp_path: Path) -> None:
    inputs = {
        **every_input("zero_data"),
        "TEXT": {"data_type": "BYTES", "dims": [2], "input_data_file": "t.bin"},
    }
    config = recorder_config([{"name": "w", "batch_size": 1, "inputs": inputs}])
    runner, model_dir = python_model(tmp_path, config, RECORDER)
    warmup_file(model_dir, "t.bin", datatypes.serialize_bytes([b"only one"]))

    with pytest.raises(WarmupError, match=r"t\.bin: BYTES tensor holds 1 elements, shape needs 2"):
        run_warmup(config, runner, model_dir)


# --- the example models --------------------------------------------------------------------


def test_torch_example_warms_up_on_zeros_and_a_data_file(
    example_repository: Path, tmp_path: Path
) -> None:
    warmup = [
        {
            "name": "zeros",
            "batch_size": 64,
            "count": 2,
            "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [64], "zero_data": True}},
        },
        {
            "name": "file",
            "batch_size": 3,
            "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [64], "input_data_file": "x"}},
        },
    ]
    config = example_config(example_repository, "tiny_mlp", warmup)
    runner = BatchRunner(config, load_backend(config, example_repository / "tiny_mlp" / "1"))
    warmup_file(tmp_path, "x", np.linspace(-1, 1, 64, dtype="<f4").tobytes())

    run_warmup(config, runner, tmp_path)


def test_onnx_example_warms_up_from_its_config_pbtxt(
    example_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (example_repository / "tiny_mlp_onnx" / "config.pbtxt").read_text() + (
        'model_warmup [{ name: "r" batch_size: 16 count: 2 inputs { key: "INPUT0" '
        "value: { data_type: TYPE_FP32 dims: [ 64 ] random_data: true } } }]\n"
    )
    model_dir = tmp_path / "tiny_mlp_onnx"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text(text)
    config = load_pbtxt(model_dir / "config.pbtxt", "tiny_mlp_onnx")
    backend = load_backend(config, example_repository / "tiny_mlp_onnx" / "1")

    with caplog.at_level(logging.INFO, logger="workers.warmup"):
        run_warmup(config, BatchRunner(config, backend), model_dir)

    assert "model tiny_mlp_onnx warmed up: 1 samples, 2 runs" in caplog.text


@pytest.mark.parametrize("source", ["zero_data", "random_data", "input_data_file"])
def test_python_tokenizer_example_warms_up_on_strings(
    example_repository: Path, tmp_path: Path, source: str
) -> None:
    text: dict[str, Any] = {"data_type": "TYPE_STRING", "dims": [1]}
    text[source] = "hello.bin" if source == "input_data_file" else True
    warmup = [{"name": source, "batch_size": 4, "inputs": {"TEXT": text}}]
    config = example_config(example_repository, "minilm_tokenizer", warmup)
    version_dir = example_repository / "minilm_tokenizer" / "1"
    runner = BatchRunner(config, load_backend(config, version_dir))
    warmup_file(tmp_path, "hello.bin", datatypes.serialize_bytes([b"Hello, warm world!"]))

    run_warmup(config, runner, tmp_path)
