"""The planning API: which steps are ready, name mapping both ways, what a request returns."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from pipelines import Pipeline, Step, load_pipelines
from tests.pipelines.helpers import write_repository
from weir.errors import InvalidInput, ServerError
from weir.repository import Repository


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return load_pipelines(Repository.load(write_repository(tmp_path)))["diamond"]


def indexes(steps: Iterable[Step]) -> list[int]:
    return [step.index for step in steps]


def test_steps_are_in_dependency_order_not_declaration_order(pipeline: Pipeline) -> None:
    assert indexes(pipeline.steps) == [1, 2, 3, 0]
    assert pipeline.inputs == ("IN",)
    assert pipeline.outputs == ("OUT",)
    assert pipeline.tensors == {"IN", "x", "l", "r", "OUT"}


def test_readiness_follows_the_graph_with_fan_out_and_fan_in(pipeline: Pipeline) -> None:
    plan = pipeline.plan()

    assert indexes(plan.ready({"IN"}, set())) == [1]
    assert plan.ready({"IN"}, {1}) == []  # started, not finished: nothing new
    # fan-out: both readers of x are ready at once
    assert indexes(plan.ready({"IN", "x"}, {1})) == [2, 3]
    # fan-in: join waits for r although l is there
    assert plan.ready({"IN", "x", "l"}, {1, 2, 3}) == []
    assert indexes(plan.ready({"IN", "x", "l", "r"}, {1, 2, 3})) == [0]
    assert not plan.is_complete({"IN", "x", "l", "r"})
    assert plan.is_complete({"IN", "x", "l", "r", "OUT"})


def test_running_the_plan_to_completion_runs_each_step_once(pipeline: Pipeline) -> None:
    plan = pipeline.plan()
    available, started, order = set(pipeline.inputs), set[int](), []
    while not plan.is_complete(available):
        ready = plan.ready(available, started)
        assert ready
        for step in ready:
            started.add(step.index)
            order.append(step.index)
            available.update(step.produces)

    assert order == [1, 2, 3, 0]


def test_step_maps_pipeline_tensors_to_model_inputs_and_outputs_back(
    pipeline: Pipeline,
) -> None:
    join = pipeline.step(0)

    assert join.model_inputs({"IN": 0, "l": 1, "r": 2}) == {"A": 1, "B": 2}
    assert join.pipeline_outputs({"Y": 5, "UNUSED": 6}) == {"OUT": 5}
    assert join.needs == {"l", "r"}
    assert join.produces == {"OUT"}
    assert join.model_outputs == ["Y"]
    assert join.label == "step 0 (model 'join' version 1)"
    assert join.config.name == "join"


def test_step_mapping_names_what_is_missing(pipeline: Pipeline) -> None:
    join = pipeline.step(0)

    with pytest.raises(ServerError, match=r"step 0 \(model 'join' version 1\): tensor r"):
        join.model_inputs({"l": 1})
    with pytest.raises(ServerError, match="model returned no output Y"):
        join.pipeline_outputs({"Z": 1})


def test_producer_and_consumers_of_a_tensor(pipeline: Pipeline) -> None:
    assert indexes(pipeline.consumers("x")) == [2, 3]
    producer = pipeline.producer("x")
    assert producer is not None and producer.index == 1
    assert pipeline.producer("IN") is None
    assert pipeline.consumers("OUT") == []


def test_unknown_step_index_is_a_key_error(pipeline: Pipeline) -> None:
    with pytest.raises(KeyError, match="no step 9"):
        pipeline.step(9)


def test_plan_returns_the_pipeline_outputs_unless_the_request_names_tensors(
    pipeline: Pipeline,
) -> None:
    assert pipeline.plan().outputs == ("OUT",)
    assert pipeline.plan(["l", "OUT"]).outputs == ("l", "OUT")


def test_plan_for_an_intermediate_tensor_runs_only_the_steps_it_needs(
    pipeline: Pipeline,
) -> None:
    plan = pipeline.plan(["l"])

    assert indexes(plan.steps) == [1, 2]
    assert indexes(plan.ready({"IN", "x"}, {1})) == [2]
    assert plan.is_complete({"IN", "x", "l"})


def test_plan_for_an_unknown_tensor_is_invalid_input(pipeline: Pipeline) -> None:
    with pytest.raises(InvalidInput, match="pipeline 'diamond' has no tensor 'nope'"):
        pipeline.plan(["OUT", "nope"])


def test_live_tensors_shrink_as_steps_start(pipeline: Pipeline) -> None:
    plan = pipeline.plan()

    assert plan.live_tensors(set()) == {"IN", "x", "l", "r", "OUT"}
    assert plan.live_tensors({1}) == {"x", "l", "r", "OUT"}
    assert plan.live_tensors({1, 2, 3}) == {"l", "r", "OUT"}
    assert plan.live_tensors({0, 1, 2, 3}) == {"OUT"}
    assert pipeline.plan(["x", "OUT"]).live_tensors({0, 1, 2, 3}) == {"x", "OUT"}
