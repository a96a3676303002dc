"""Triton's model_warmup loads from config.yaml and config.pbtxt and is checked against the
model's inputs; every bad sample is a ConfigError naming the file and the field."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from weir.config import ModelConfig, load_config
from weir.config_warmup import ModelWarmup, WarmupInput
from weir.errors import ConfigError
from weir.pbtxt import load_pbtxt

PBTXT = """
name: "m"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] optional: true }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

WARMUP_PBTXT = """
model_warmup [
  {
    name: "w"
    batch_size: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
  },
  {
    name: "from_files"
    batch_size: 8
    count: 3
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
    inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 5 ] input_data_file: "t" } }
  }
]
"""

WARMUP_YAML: list[dict[str, Any]] = [
    {
        "name": "w",
        "batch_size": 2,
        "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}},
    },
    {
        "name": "from_files",
        "batch_size": 8,
        "count": 3,
        "inputs": {
            "INPUT0": {"data_type": "FP32", "dims": [4], "random_data": True},
            "TEXT": {"data_type": "TYPE_STRING", "dims": [5], "input_data_file": "t"},
        },
    },
]


def raw(warmup: Any, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "backend": "pytorch",
        "max_batch_size": 8,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
        ],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "model_warmup": warmup,
    }
    config.update(overrides)
    return config


def sample(**fields: Any) -> dict[str, Any]:
    """One valid sample for ``raw``'s model, with ``fields`` replacing its own."""
    one: dict[str, Any] = {
        "name": "w",
        "batch_size": 1,
        "inputs": {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}},
    }
    one.update(fields)
    return one


def fp32(**fields: Any) -> dict[str, Any]:
    return {"INPUT0": {"data_type": "TYPE_FP32", "dims": [4], **fields}}


def load_yaml(tmp_path: Path, config: dict[str, Any]) -> ModelConfig:
    model_dir = tmp_path / "m"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return load_config(model_dir / "config.yaml", "m")


def yaml_error(tmp_path: Path, config: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_yaml(tmp_path, config)
    message = str(info.value)
    assert message.startswith(str(tmp_path / "m" / "config.yaml"))
    return message


def write_pbtxt(tmp_path: Path, text: str) -> Path:
    model_dir = tmp_path / "m"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir / "config.pbtxt"


# --- valid samples -------------------------------------------------------------------------


def test_yaml_samples_load_with_triton_field_names(tmp_path: Path) -> None:
    config = load_yaml(tmp_path, raw(WARMUP_YAML))

    first, second = config.model_warmup
    assert first == ModelWarmup(
        name="w",
        batch_size=2,
        inputs={"INPUT0": WarmupInput(data_type="FP32", dims=(4,), zero_data=True)},
    )
    assert second.count == 3
    assert second.runs == 3
    assert second.inputs["INPUT0"].random_data is True
    assert second.inputs["TEXT"].data_type == "BYTES"
    assert second.inputs["TEXT"].input_data_file == "t"


def test_pbtxt_block_loads_as_its_yaml_does(tmp_path: Path) -> None:
    from_pbtxt = load_pbtxt(write_pbtxt(tmp_path / "p", PBTXT + WARMUP_PBTXT), "m")
    from_yaml = load_yaml(tmp_path / "y", raw(WARMUP_YAML))

    assert from_pbtxt.model_warmup == from_yaml.model_warmup


def test_model_warmup_is_kept_not_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="weir"):
        config = load_pbtxt(write_pbtxt(tmp_path, PBTXT + WARMUP_PBTXT), "m")

    assert len(config.model_warmup) == 2
    assert "model_warmup" not in caplog.text


def test_no_model_warmup_is_an_empty_tuple(tmp_path: Path) -> None:
    config = load_pbtxt(write_pbtxt(tmp_path, PBTXT), "m")
    assert config.model_warmup == ()


def test_count_and_batch_size_default_to_triton_zero_and_count_zero_runs_once(
    tmp_path: Path,
) -> None:
    (warmup,) = load_yaml(
        tmp_path, raw([{"name": "w", "inputs": fp32(zero_data=True)}])
    ).model_warmup

    assert (warmup.batch_size, warmup.count, warmup.runs) == (0, 0, 1)


def test_variable_dims_take_any_positive_size(tmp_path: Path) -> None:
    inputs = {
        **fp32(zero_data=True),
        "TEXT": {"data_type": "BYTES", "dims": [7], "zero_data": True},
    }
    (warmup,) = load_yaml(tmp_path, raw([sample(inputs=inputs)])).model_warmup
    assert warmup.inputs["TEXT"].dims == (7,)


def test_a_model_that_does_not_batch_takes_batch_size_one(tmp_path: Path) -> None:
    config = load_yaml(tmp_path, raw([sample(batch_size=1)], max_batch_size=0))
    assert config.model_warmup[0].batch_size == 1


# --- bad samples: ConfigError naming the file and the field --------------------------------


@pytest.mark.parametrize(
    ("warmup", "field", "words"),
    [
        (sample(inputs=fp32()), "model_warmup.0.inputs.INPUT0", "set exactly one of"),
        (
            sample(inputs=fp32(zero_data=True, random_data=True)),
            "model_warmup.0.inputs.INPUT0",
            "(got zero_data, random_data)",
        ),
        (
            sample(inputs=fp32(input_data_file="../secret")),
            "model_warmup.0.inputs.INPUT0.input_data_file",
            "must name a file in the model directory's warmup/ folder",
        ),
        (
            sample(inputs=fp32(zero_data=True, data_type="TYPE_FLOAT")),
            "model_warmup.0.inputs.INPUT0.data_type",
            "unknown data_type 'TYPE_FLOAT'",
        ),
        (
            sample(inputs=fp32(zero_data=True, data_type="TYPE_FP16")),
            "model_warmup.0.inputs.INPUT0.data_type",
            "FP16, but input 'INPUT0' is FP32",
        ),
        (
            sample(inputs=fp32(zero_data=True, dims=[5])),
            "model_warmup.0.inputs.INPUT0.dims",
            "[5] do not fit input 'INPUT0', [4]",
        ),
        (
            sample(inputs=fp32(zero_data=True, dims=[2, 2])),
            "model_warmup.0.inputs.INPUT0.dims",
            "[2, 2] do not fit",
        ),
        (
            sample(inputs=fp32(zero_data=True, dims=[-1])),
            "model_warmup.0.inputs.INPUT0.dims",
            "each dim is positive",
        ),
        (
            sample(
                inputs={**fp32(zero_data=True), "NOPE": {"data_type": "FP32", "zero_data": True}}
            ),
            "model_warmup.0.inputs.NOPE",
            "the model has no input named 'NOPE'",
        ),
        (
            sample(inputs={"TEXT": {"data_type": "BYTES", "dims": [1], "zero_data": True}}),
            "model_warmup.0.inputs",
            "no data for input 'INPUT0', which is not optional",
        ),
        (sample(batch_size=9), "model_warmup.0.batch_size", "9 exceeds max_batch_size 8"),
        (sample(batch_size=-1), "model_warmup.0.batch_size", "greater than or equal to 0"),
        (sample(count=-2), "model_warmup.0.count", "greater than or equal to 0"),
        (sample(name=""), "model_warmup.0.name", "at least 1 character"),
        (sample(iterations=2), "model_warmup.0.iterations", "Extra inputs are not permitted"),
    ],
)
def test_bad_sample_names_the_file_and_the_field(
    tmp_path: Path, warmup: dict[str, Any], field: str, words: str
) -> None:
    message = yaml_error(tmp_path, raw([sample(name="ok"), warmup]))

    assert f"{field.replace('model_warmup.0', 'model_warmup.1')}: " in message
    assert words in message


def test_batch_size_above_one_on_a_model_that_does_not_batch_is_rejected(tmp_path: Path) -> None:
    message = yaml_error(tmp_path, raw([sample(batch_size=2)], max_batch_size=0))

    assert "model_warmup.0.batch_size: a model with max_batch_size 0 does not batch" in message


def test_an_ensemble_has_no_warm_up(tmp_path: Path) -> None:
    steps = {"step": [{"model_name": "m", "input_map": {"INPUT0": "INPUT0"}}]}
    config = raw([sample()], platform="ensemble", ensemble_scheduling=steps)
    del config["backend"]

    message = yaml_error(tmp_path, config)

    assert "model_warmup: an ensemble runs no instances of its own to warm up" in message


def test_bad_pbtxt_sample_names_the_file_and_the_field(tmp_path: Path) -> None:
    text = PBTXT + WARMUP_PBTXT.replace('input_data_file: "t"', 'input_data_file: "a/b"')
    path = write_pbtxt(tmp_path, text)

    with pytest.raises(ConfigError) as info:
        load_pbtxt(path, "m")

    assert str(info.value).startswith(f"{path}: ")
    assert "model_warmup.1.inputs.TEXT.input_data_file: 'a/b' must name a file" in str(info.value)


def test_pbtxt_sample_with_two_sources_is_a_protobuf_error_with_line(tmp_path: Path) -> None:
    text = PBTXT + WARMUP_PBTXT.replace("zero_data: true", "zero_data: true random_data: true")
    path = write_pbtxt(tmp_path, text)

    with pytest.raises(ConfigError, match="another member of oneof") as info:
        load_pbtxt(path, "m")
    assert str(info.value).startswith(f"{path}:")
