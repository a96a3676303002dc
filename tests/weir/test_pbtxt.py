"""Triton's config.pbtxt loads into the same ModelConfig as the equivalent config.yaml."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from weir.config import Backend, load_config
from weir.config_sequence import ControlKind
from weir.errors import ConfigError
from weir.pbtxt import load_pbtxt
from weir.repository import Repository

PLAIN_PBTXT = """
name: "tiny"
platform: "pytorch_libtorch"
max_batch_size: 16
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 3, -1 ] },
  { name: "MASK" data_type: TYPE_BOOL dims: [ 3 ] optional: true }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP16 dims: [ 3 ] } ]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }
instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0, 1 ] } ]
version_policy { specific { versions: [ 1, 3 ] } }
parameters { key: "threads" value { string_value: "4" } }
"""

PLAIN_YAML: dict[str, Any] = {
    "name": "tiny",
    "backend": "pytorch",
    "max_batch_size": 16,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3, -1]},
        {"name": "MASK", "data_type": "TYPE_BOOL", "dims": [3], "optional": True},
    ],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP16", "dims": [3]}],
    "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 500},
    "instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}],
    "version_policy": {"specific": {"versions": [1, 3]}},
    "parameters": {"threads": "4"},
}

ENSEMBLE_PBTXT = """
name: "embed"
platform: "ensemble"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "tok"
      model_version: -1
      input_map { key: "TEXT" value: "TEXT" }
      output_map { key: "ids" value: "token_ids" }
    },
    {
      model_name: "enc"
      model_version: 2
      input_map { key: "input_ids" value: "token_ids" }
      output_map { key: "pooled" value: "EMBEDDING" }
    }
  ]
}
"""

ENSEMBLE_YAML: dict[str, Any] = {
    "name": "embed",
    "platform": "ensemble",
    "max_batch_size": 8,
    "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}],
    "output": [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [4]}],
    "ensemble_scheduling": {
        "step": [
            {
                "model_name": "tok",
                "model_version": -1,
                "input_map": {"TEXT": "TEXT"},
                "output_map": {"ids": "token_ids"},
            },
            {
                "model_name": "enc",
                "model_version": 2,
                "input_map": {"input_ids": "token_ids"},
                "output_map": {"pooled": "EMBEDDING"},
            },
        ]
    },
}


def write(model_dir: Path, name: str, text: str) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / name
    path.write_text(text)
    return path


def test_plain_model_pbtxt_equals_its_yaml(tmp_path: Path) -> None:
    pbtxt = write(tmp_path / "a" / "tiny", "config.pbtxt", PLAIN_PBTXT)
    yml = write(tmp_path / "b" / "tiny", "config.yaml", yaml.safe_dump(PLAIN_YAML))

    from_pbtxt = load_pbtxt(pbtxt, "tiny")

    assert from_pbtxt == load_config(yml, "tiny")
    assert from_pbtxt.input[0].dims == (3, -1)
    assert from_pbtxt.version_policy.specific is not None
    assert from_pbtxt.version_policy.specific.versions == (1, 3)


def test_ensemble_pbtxt_equals_its_yaml(tmp_path: Path) -> None:
    pbtxt = write(tmp_path / "a" / "embed", "config.pbtxt", ENSEMBLE_PBTXT)
    yml = write(tmp_path / "b" / "embed", "config.yaml", yaml.safe_dump(ENSEMBLE_YAML))

    from_pbtxt = load_pbtxt(pbtxt, "embed")

    assert from_pbtxt == load_config(yml, "embed")
    assert from_pbtxt.backend is Backend.ENSEMBLE
    assert from_pbtxt.instance_group == ()
    assert from_pbtxt.ensemble_scheduling is not None
    steps = from_pbtxt.ensemble_scheduling.step
    assert [(s.model_name, s.model_version) for s in steps] == [("tok", -1), ("enc", 2)]
    assert steps[1].input_map == {"input_ids": "token_ids"}


def test_name_defaults_to_the_directory_as_in_triton(tmp_path: Path) -> None:
    text = PLAIN_PBTXT.replace('name: "tiny"', "")
    config = load_pbtxt(write(tmp_path / "tiny", "config.pbtxt", text), "tiny")
    assert config.name == "tiny"


def test_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "m", "config.pbtxt", 'name: "m"\ninput [ { name: "X" ]\n')

    with pytest.raises(ConfigError) as info:
        load_pbtxt(path, "m")
    assert str(info.value).startswith(f"{path}:2:")
    assert "Expected identifier or number, got ]" in str(info.value)


def test_unknown_field_names_the_file_and_the_field(tmp_path: Path) -> None:
    path = write(tmp_path / "m", "config.pbtxt", 'name: "m"\nmax_batch: 4\n')

    with pytest.raises(ConfigError) as info:
        load_pbtxt(path, "m")
    assert str(info.value).startswith(f"{path}:2:")
    assert 'no field named "max_batch"' in str(info.value)


def test_invalid_value_names_the_file_and_the_field(tmp_path: Path) -> None:
    text = PLAIN_PBTXT.replace("dims: [ 3 ] }", "dims: [ 0 ] }")
    path = write(tmp_path / "tiny", "config.pbtxt", text)

    with pytest.raises(ConfigError, match=r"output\.0\.dims") as info:
        load_pbtxt(path, "tiny")
    assert str(path) in str(info.value)


def test_unsupported_fields_are_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        PLAIN_PBTXT.replace("dims: [ 3 ] } ]", "dims: [ 3 ] is_shape_tensor: true } ]")
        + 'model_operations { op_library_filename: "libop.so" }\n'
    )
    path = write(tmp_path / "tiny", "config.pbtxt", text)

    with caplog.at_level(logging.WARNING, logger="weir"):
        config = load_pbtxt(path, "tiny")

    assert config.output[0].name == "OUTPUT0"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "output[0].is_shape_tensor is not supported yet" in warned
    assert "model_operations is not supported yet" in warned


def test_the_response_cache_is_read(tmp_path: Path) -> None:
    path = write(
        tmp_path / "tiny", "config.pbtxt", PLAIN_PBTXT + "response_cache { enable: true }\n"
    )
    assert load_pbtxt(path, "tiny").caches_responses


def test_a_sequence_batcher_is_read_with_tritons_defaults(tmp_path: Path) -> None:
    sequence = (
        "sequence_batching { direct { } control_input [ { name: 'S' control [ "
        "{ kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] } ] }"
    )
    text = PLAIN_PBTXT.replace(
        "dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }",
        sequence,
    )
    path = write(tmp_path / "tiny", "config.pbtxt", text)
    sequencing = load_pbtxt(path, "tiny").sequence_batching
    assert sequencing is not None
    assert sequencing.max_sequence_idle_microseconds == 1_000_000  # Triton's default
    assert sequencing.direct is not None
    ((name, control),) = sequencing.control(ControlKind.START)
    assert (name, control.datatype, control.value(True)) == ("S", "BOOL", True)


def test_repository_reads_pbtxt_when_there_is_no_yaml(tmp_path: Path) -> None:
    write(tmp_path / "tiny", "config.pbtxt", PLAIN_PBTXT)
    for version in ("1", "3"):
        (tmp_path / "tiny" / version).mkdir()

    entry = Repository.load(tmp_path).models["tiny"]

    assert entry.versions == ("1", "3")
    assert entry.config_file == tmp_path / "tiny" / "config.pbtxt"


def test_yaml_wins_over_pbtxt(tmp_path: Path) -> None:
    raw = {**PLAIN_YAML, "max_batch_size": 32, "version_policy": {"latest": {}}}
    write(tmp_path / "tiny", "config.yaml", yaml.safe_dump(raw))
    write(tmp_path / "tiny", "config.pbtxt", "this is not protobuf text")
    (tmp_path / "tiny" / "1").mkdir()

    entry = Repository.load(tmp_path).models["tiny"]

    assert entry.config.max_batch_size == 32
    assert entry.config_file == tmp_path / "tiny" / "config.yaml"


def test_tensor_without_dims_has_empty_dims(tmp_path: Path) -> None:
    text = PLAIN_PBTXT.replace("data_type: TYPE_FP16 dims: [ 3 ]", "data_type: TYPE_FP16")
    config = load_pbtxt(write(tmp_path / "tiny", "config.pbtxt", text), "tiny")
    assert config.output[0].dims == ()


def step_model(root: Path, name: str, model_input: Any, model_output: Any) -> None:
    raw = {
        "backend": "python",
        "max_batch_size": 8,
        "input": [model_input],
        "output": [model_output],
    }
    write(root / name, "config.yaml", yaml.safe_dump(raw))
    for version in ("1", "2"):
        (root / name / version).mkdir()


def test_ensemble_pbtxt_without_version_directory_loads_and_checks_its_steps(
    tmp_path: Path,
) -> None:
    text = {"data_type": "TYPE_STRING", "dims": [1]}
    step_model(tmp_path, "tok", {"name": "TEXT", **text}, {"name": "ids", **text})
    pooled = {"name": "pooled", "data_type": "TYPE_FP32", "dims": [4]}
    step_model(tmp_path, "enc", {"name": "input_ids", **text}, pooled)
    write(tmp_path / "embed", "config.pbtxt", ENSEMBLE_PBTXT)

    entry = Repository.load(tmp_path).models["embed"]

    assert entry.versions == ("1",)
    assert entry.config.is_ensemble


def test_ensemble_pbtxt_with_a_broken_graph_names_the_pbtxt(tmp_path: Path) -> None:
    text = {"data_type": "TYPE_STRING", "dims": [1]}
    step_model(tmp_path, "tok", {"name": "TEXT", **text}, {"name": "ids", **text})
    write(tmp_path / "embed", "config.pbtxt", ENSEMBLE_PBTXT)

    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    assert str(info.value) == (
        f"{tmp_path / 'embed' / 'config.pbtxt'}: pipeline 'embed': step 1 (enc): "
        "unknown model 'enc'"
    )
