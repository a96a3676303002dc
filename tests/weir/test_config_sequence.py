"""``sequence_batching``: Triton's fields, and each mistake named with its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.weir.test_config import config_error, load, valid_raw

START = {
    "name": "START",
    "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}],
}
CORRID = {
    "name": "ID",
    "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}],
}
STATE = {"input_name": "IN_S", "output_name": "OUT_S", "data_type": "TYPE_FP32", "dims": [-1]}


def sequence(**fields: Any) -> dict[str, Any]:
    raw = valid_raw(sequence_batching=fields)
    raw.pop("dynamic_batching", None)
    return raw


def test_controls_and_states_join_the_inputs_an_instance_runs_with(tmp_path: Path) -> None:
    config = load(tmp_path, sequence(control_input=[START, CORRID], state=[STATE]))
    run = config.run_config()
    added = [(s.name, s.datatype, s.dims) for s in run.input[len(config.input) :]]
    assert added == [("START", "INT32", (1,)), ("ID", "UINT64", (1,)), ("IN_S", "FP32", (-1,))]
    assert [s.name for s in run.output[len(config.output) :]] == ["OUT_S"]
    assert not config.caches_responses


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_END"}]}]},
         "takes exactly one of int32_false_true"),
        ({"control_input": [{"name": "S", "control": [
            {"kind": "CONTROL_SEQUENCE_READY", "fp32_false_true": [0, 1, 2]}]}]},
         "with two values"),
        ({"control_input": [{"name": "ID", "control": [
            {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_FP32"}]}]},
         "takes a data_type"),
        ({"direct": {}, "oldest": {}}, "set only one of direct, oldest"),
        ({"control_input": [{**START, "name": "INPUT0"}]}, "input 'INPUT0' is named twice"),
        ({"state": [{**STATE, "initial_state": {"data_type": "TYPE_FP32", "dims": [1]}}]},
         "one of zero_data: true or data_file"),
        ({"state": [{**STATE, "initial_state": {"data_type": "TYPE_INT32", "zero_data": True}}]},
         "differs from the state's FP32"),
        ({"oldest": {"preferred_batch_size": [64]}}, "exceeds max_batch_size"),
    ],
)  # fmt: skip
def test_a_wrong_sequence_batcher_is_refused_naming_the_problem(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    error, _ = config_error(tmp_path, sequence(**fields))
    assert message in error


def test_a_model_has_one_scheduler(tmp_path: Path) -> None:
    error, _ = config_error(tmp_path, valid_raw(sequence_batching={}, dynamic_batching={}))
    assert "set only one of dynamic_batching, sequence_batching" in error
