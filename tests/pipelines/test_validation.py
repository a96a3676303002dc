"""A broken pipeline stops the repository from loading, naming pipeline, step and tensor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipelines import load_pipelines
from tests.pipelines.helpers import (
    diamond,
    edited,
    join,
    steps_of,
    tensor,
    unary,
    write_model,
    write_repository,
)
from weir.errors import ConfigError
from weir.repository import Repository


def load_error(tmp_path: Path, pipeline: dict[str, Any], models: Any = None) -> str:
    write_repository(tmp_path, pipeline, models)
    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'diamond' / 'config.yaml'}: pipeline 'diamond': ")
    return message


def set_step(index: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    def edit(pipeline: dict[str, Any]) -> None:
        steps_of(pipeline)[index].update(fields)

    return edit


# --- the graph against the step models ----------------------------------------------------


def test_valid_diamond_loads_and_serves_version_1_without_a_version_directory(
    tmp_path: Path,
) -> None:
    entry = Repository.load(write_repository(tmp_path)).models["diamond"]
    assert entry.versions == ("1",)
    assert entry.config.instance_group == ()


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(
            set_step(3, model_name="nope"),
            "step 3 (nope): unknown model 'nope'",
            id="unknown model",
        ),
        pytest.param(
            set_step(2, model_version=7),
            "step 2 (unary): model_version 7: model 'unary' serves version 1 only",
            id="unknown version",
        ),
        pytest.param(
            set_step(3, output_map={"Y": "l"}),
            "step 3 (unary): tensor 'l' is produced twice (also by step 2 (unary))",
            id="produced twice",
        ),
        pytest.param(
            set_step(1, output_map={"Y": "IN"}),
            "step 1 (unary): tensor 'IN' is produced twice (also by pipeline input)",
            id="produced as a pipeline input",
        ),
        pytest.param(
            set_step(2, input_map={"X": "ghost"}),
            "step 2 (unary): tensor 'ghost' (for input 'X') is neither a pipeline input "
            "nor a step's output",
            id="consumed, never produced",
        ),
        pytest.param(
            set_step(0, output_map={"Y": "elsewhere"}),
            "output tensor 'OUT' is produced by no step's output_map",
            id="output never produced",
        ),
        pytest.param(
            set_step(2, input_map={"Z": "x"}),
            "step 2 (unary): input_map: 'Z' is not an input of model 'unary' (inputs: X)",
            id="input_map key not an input",
        ),
        pytest.param(
            set_step(0, input_map={"A": "l"}),
            "step 0 (join): input_map: model input 'B' is not mapped",
            id="required input unmapped",
        ),
        pytest.param(
            set_step(1, output_map={"Z": "x"}),
            "step 1 (unary): output_map: 'Z' is not an output of model 'unary' (outputs: Y)",
            id="output_map key not an output",
        ),
        pytest.param(
            set_step(1, input_map={"X": "r"}),
            "step 1 (unary): tensor 'r' is part of a cycle: step 1 (unary) needs 'r' -> "
            "step 3 (unary) needs 'x' -> step 1 (unary)",
            id="cycle",
        ),
        pytest.param(
            set_step(1, input_map={"X": "x"}),
            "step 1 (unary): tensor 'x' is part of a cycle: step 1 (unary) needs 'x' -> "
            "step 1 (unary)",
            id="step reads its own output",
        ),
    ],
)
def test_broken_graph_is_a_config_error_naming_step_and_tensor(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], expected: str
) -> None:
    message = load_error(tmp_path, edited(edit))
    assert message.endswith(expected), message


def test_datatype_mismatch_between_step_output_and_step_input(tmp_path: Path) -> None:
    bad_join = join()
    bad_join["input"][0] = tensor("A", [4], "TYPE_INT32")
    message = load_error(tmp_path, diamond(), [unary(), bad_join])
    assert message.endswith(
        "tensor 'l': step 2 (unary) gives FP32 [-1, 4], step 0 (join) input 'A' takes INT32 [-1, 4]"
    )


def test_dims_mismatch_between_step_output_and_step_input(tmp_path: Path) -> None:
    bad_join = join()
    bad_join["input"][1] = tensor("B", [5])
    message = load_error(tmp_path, diamond(), [unary(), bad_join])
    assert message.endswith(
        "tensor 'r': step 3 (unary) gives FP32 [-1, 4], step 0 (join) input 'B' takes FP32 [-1, 5]"
    )


def test_rank_mismatch_is_a_dims_mismatch(tmp_path: Path) -> None:
    bad_join = join()
    bad_join["input"][1] = tensor("B", [4, 1])
    message = load_error(tmp_path, diamond(), [unary(), bad_join])
    assert "step 0 (join) input 'B' takes FP32 [-1, 4, 1]" in message


def test_variable_dim_matches_any_size(tmp_path: Path) -> None:
    loose_join = join()
    loose_join["input"][1] = tensor("B", [-1])
    write_repository(tmp_path, diamond(), [unary(), loose_join])
    assert "diamond" in Repository.load(tmp_path).models


def test_pipeline_input_spec_must_match_the_step_input(tmp_path: Path) -> None:
    pipeline = diamond()
    pipeline["input"] = [tensor("IN", [3])]
    message = load_error(tmp_path, pipeline)
    assert message.endswith(
        "tensor 'IN': pipeline input gives FP32 [-1, 3], step 1 (unary) input 'X' takes "
        "FP32 [-1, 4]"
    )


def test_pipeline_output_spec_must_match_its_producer(tmp_path: Path) -> None:
    pipeline = diamond()
    pipeline["output"] = [tensor("OUT", [2], "TYPE_FP16")]
    message = load_error(tmp_path, pipeline)
    assert message.endswith(
        "tensor 'OUT': step 0 (join) gives FP32 [-1, 2], pipeline output takes FP16 [-1, 2]"
    )


def test_step_model_that_batches_less_than_the_pipeline_is_refused(tmp_path: Path) -> None:
    small_join = {**join(), "max_batch_size": 4}
    message = load_error(tmp_path, diamond(), [unary(), small_join])
    assert message.endswith(
        "step 0 (join): max_batch_size 4 of model 'join' is below the pipeline's 8"
    )


def test_a_pipeline_as_a_step_is_refused(tmp_path: Path) -> None:
    write_repository(tmp_path)
    outer = {
        **diamond(),
        "name": "outer",
        "ensemble_scheduling": {
            "step": [
                {"model_name": "diamond", "input_map": {"IN": "IN"}, "output_map": {"OUT": "OUT"}}
            ]
        },
    }
    write_model(tmp_path, outer, versions=())
    with pytest.raises(
        ConfigError, match=r"pipeline 'outer': step 0 \(diamond\): model 'diamond' is an ensemble"
    ):
        Repository.load(tmp_path)


def test_step_versions_resolve_to_the_named_one_or_the_latest_served(tmp_path: Path) -> None:
    write_model(tmp_path, {**unary(), "version_policy": {"all": {}}}, versions=(1, 2))
    write_model(tmp_path, {**unary(), "name": "other"}, versions=(1, 2))
    pipeline = {
        **diamond(),
        "output": [tensor("OUT", [4])],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "unary",
                    "model_version": 1,
                    "input_map": {"X": "IN"},
                    "output_map": {"Y": "x"},
                },
                {
                    "model_name": "other",
                    "model_version": -1,
                    "input_map": {"X": "x"},
                    "output_map": {"Y": "OUT"},
                },
            ]
        },
    }
    write_model(tmp_path, pipeline, versions=())
    steps = load_pipelines(Repository.load(tmp_path))["diamond"].steps
    assert [(s.model, s.version) for s in steps] == [("unary", "1"), ("other", "2")]


# --- the ensemble's own config ------------------------------------------------------------


def test_ensemble_with_an_empty_version_directory_loads(tmp_path: Path) -> None:
    write_repository(tmp_path)
    (tmp_path / "diamond" / "1").mkdir()
    assert Repository.load(tmp_path).models["diamond"].versions == ("1",)


def test_ensemble_follows_its_version_policy_when_it_has_version_directories(
    tmp_path: Path,
) -> None:
    write_repository(tmp_path)
    for version in ("1", "2"):
        (tmp_path / "diamond" / version).mkdir()
    assert Repository.load(tmp_path).models["diamond"].versions == ("2",)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param({"ensemble_scheduling": None}, "ensemble_scheduling", id="no steps"),
        pytest.param(
            {"ensemble_scheduling": {"step": []}}, "ensemble_scheduling.step", id="empty steps"
        ),
        pytest.param(
            {"instance_group": [{"kind": "KIND_CPU"}]}, "instance_group", id="instance_group"
        ),
        pytest.param(
            {"dynamic_batching": {"max_queue_delay_microseconds": 10}},
            "dynamic_batching",
            id="batching",
        ),
        pytest.param(
            {"ensemble_scheduling": {"step": [{"model_name": "unary", "model_namespace": "x"}]}},
            "ensemble_scheduling.step.0.model_namespace",
            id="unknown step field",
        ),
        pytest.param(
            {"ensemble_scheduling": {"step": [{"model_name": "unary", "model_version": -2}]}},
            "ensemble_scheduling.step.0.model_version",
            id="bad version",
        ),
    ],
)
def test_bad_ensemble_config_names_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    pipeline = {**diamond(), **change}
    write_repository(tmp_path, pipeline)
    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    assert str(tmp_path / "diamond" / "config.yaml") in str(info.value)
    assert field in str(info.value)


def test_ensemble_scheduling_on_a_plain_model_is_refused(tmp_path: Path) -> None:
    bad_unary = {**unary(), "ensemble_scheduling": diamond()["ensemble_scheduling"]}
    write_repository(tmp_path, models=[bad_unary, join()])
    with pytest.raises(ConfigError, match="ensemble_scheduling is only for platform: ensemble"):
        Repository.load(tmp_path)


def test_load_pipelines_returns_only_the_ensembles(tmp_path: Path) -> None:
    pipelines = load_pipelines(Repository.load(write_repository(tmp_path)))
    assert list(pipelines) == ["diamond"]
    assert pipelines["diamond"].versions == ("1",)
