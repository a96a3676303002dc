"""``pb_utils.ModelConfig``: what ``auto_complete_config`` may change, by Triton's rules."""

from __future__ import annotations

import re

import pytest

from workers.backends import pb_utils

FP32_4 = {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}


def config(**fields: object) -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig({"name": "m", "backend": "python", **fields})


def test_a_bare_config_takes_inputs_outputs_and_batching() -> None:
    made = config()
    made.add_input(FP32_4)
    made.add_output({"name": "OUTPUT0", "data_type": "TYPE_INT64", "dims": [-1]})
    made.set_max_batch_size(8)
    made.set_dynamic_batching()
    made.set_model_transaction_policy({"decoupled": True})
    assert made.as_dict() == {
        "name": "m",
        "backend": "python",
        "max_batch_size": 8,
        "input": [FP32_4],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT64", "dims": [-1]}],
        "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": True},
    }


def test_the_json_string_triton_passes_is_accepted() -> None:
    made = pb_utils.ModelConfig('{"name": "m", "max_batch_size": 4}')
    assert made.as_dict()["max_batch_size"] == 4
    assert made.as_dict()["input"] == []


def test_a_tensor_the_config_names_may_be_repeated_and_filled() -> None:
    made = config(input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": []}])
    made.add_input({**FP32_4, "optional": True})
    assert made.as_dict()["input"] == [{**FP32_4, "optional": True}]
    made.add_input(FP32_4)  # the same again: no second entry
    assert len(made.as_dict()["input"]) == 1


@pytest.mark.parametrize(
    ("given", "added", "said"),
    [
        (FP32_4, {**FP32_4, "data_type": "TYPE_INT32"}, "says TYPE_FP32"),
        (FP32_4, {**FP32_4, "dims": [5]}, "gives dims [4]"),
        ({**FP32_4, "optional": False}, {**FP32_4, "optional": True}, "optional False"),
    ],
)
def test_the_config_file_wins_over_the_model(
    given: dict[str, object], added: dict[str, object], said: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        config(input=[given]).add_input(added)


@pytest.mark.parametrize(
    ("tensor", "said"),
    [
        ({"name": "X", "data_type": "TYPE_FP32"}, "lacks 'dims'"),
        ({"data_type": "TYPE_FP32", "dims": [1]}, "lacks 'name'"),
        ({**FP32_4, "shape": [4]}, "has 'shape'"),
    ],
)
def test_a_malformed_tensor_is_refused(tensor: dict[str, object], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        config().add_output(tensor)


def test_an_output_takes_no_optional() -> None:
    with pytest.raises(ValueError, match="has 'optional'"):
        config().add_output({**FP32_4, "optional": True})


def test_max_batch_size_may_not_fall_below_the_config_file() -> None:
    made = config(max_batch_size=16)
    with pytest.raises(ValueError, match="max_batch_size 16"):
        made.set_max_batch_size(8)
    made.set_max_batch_size(32)
    assert made.as_dict()["max_batch_size"] == 32


def test_dynamic_batching_is_not_set_over_another_scheduler() -> None:
    with pytest.raises(ValueError, match="sequence_batching"):
        config(sequence_batching={}).set_dynamic_batching()
    kept = config(dynamic_batching={"max_queue_delay_microseconds": 100})
    kept.set_dynamic_batching()
    assert kept.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 100}


def test_decoupled_stated_in_the_file_is_not_changed() -> None:
    with pytest.raises(ValueError, match="decoupled True"):
        config(model_transaction_policy={"decoupled": True}).set_model_transaction_policy(
            {"decoupled": False}
        )
    with pytest.raises(ValueError, match="only 'decoupled'"):
        config().set_model_transaction_policy({"ordered": True})
