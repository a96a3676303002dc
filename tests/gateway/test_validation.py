"""Unit tests for checking a parsed request against the model config (gateway.validation)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gateway.codec import InferBody, RequestedOutput
from gateway.validation import check_request, queue_fields, request_timeout_s
from weir import wire
from weir.config import ModelConfig
from weir.errors import InvalidInput
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.wire import InferRequest


def model(max_batch_size: int = 8, **overrides: Any) -> ModelConfig:
    raw: dict[str, Any] = {
        "name": "clf",
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "input": [
            {"name": "IMAGE", "data_type": "TYPE_FP32", "dims": [3, -1]},
            {"name": "MASK", "data_type": "TYPE_INT64", "dims": [2]},
        ],
        "output": [
            {"name": "SCORES", "data_type": "TYPE_FP32", "dims": [10]},
            {"name": "LABEL", "data_type": "TYPE_STRING", "dims": [1]},
        ],
    }
    raw.update(overrides)
    return ModelConfig.model_validate(raw)


def tensor(shape: tuple[int, ...], dtype: type[np.generic] = np.float32) -> Tensor:
    return Tensor.from_numpy(np.zeros(shape, dtype=dtype))


def body(
    image: tuple[int, ...] | None = (2, 3, 5),
    mask: tuple[int, ...] | None = (2, 2),
    outputs: tuple[str, ...] = (),
    **extra: Tensor,
) -> InferBody:
    inputs: dict[str, Tensor] = {}
    if image is not None:
        inputs["IMAGE"] = tensor(image)
    if mask is not None:
        inputs["MASK"] = tensor(mask, np.int64)
    inputs.update(extra)
    return InferBody(inputs=inputs, outputs=[RequestedOutput(name) for name in outputs])


def rejected(config: ModelConfig, request: InferBody) -> str:
    with pytest.raises(InvalidInput) as info:
        check_request(config, request)
    return info.value.message


def test_valid_request_returns_its_batch_size() -> None:
    assert check_request(model(), body()) == 2


def test_batch_size_up_to_max_batch_size_is_accepted() -> None:
    assert check_request(model(max_batch_size=8), body((8, 3, 1), (8, 2))) == 8
    assert check_request(model(max_batch_size=8), body((1, 3, 1), (1, 2))) == 1


def test_variable_dim_accepts_any_size() -> None:
    for width in (1, 7, 1000):
        assert check_request(model(), body((4, 3, width), (4, 2))) == 4


def test_requested_outputs_that_exist_are_accepted() -> None:
    assert check_request(model(), body(outputs=("LABEL", "SCORES"))) == 2


def test_unexpected_input_name_is_rejected_naming_it() -> None:
    message = rejected(model(), body(EXTRA=tensor((2, 1))))
    assert "unexpected input 'EXTRA'" in message
    assert "'clf'" in message


def test_missing_input_is_rejected_naming_it() -> None:
    assert "missing input 'MASK'" in rejected(model(), body(mask=None))


def test_missing_optional_input_is_accepted() -> None:
    config = model(
        input=[
            {"name": "IMAGE", "data_type": "TYPE_FP32", "dims": [3, -1]},
            {"name": "MASK", "data_type": "TYPE_INT64", "dims": [2], "optional": True},
        ]
    )
    assert check_request(config, body(mask=None)) == 2


def test_wrong_datatype_is_rejected_naming_the_input_and_types() -> None:
    request = body()
    request.inputs["MASK"] = tensor((2, 2), np.int32)
    message = rejected(model(), request)
    assert "input 'MASK'" in message
    assert "INT32" in message
    assert "INT64" in message


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5, 1), (3, 5)])
def test_wrong_rank_is_rejected_naming_the_input(shape: tuple[int, ...]) -> None:
    message = rejected(model(), body(image=shape))
    assert "input 'IMAGE'" in message
    assert "Expected [-1,3,-1]" in message


def test_wrong_fixed_dim_is_rejected_naming_the_input() -> None:
    message = rejected(model(), body(image=(2, 4, 5)))
    assert "unexpected shape for input 'IMAGE'" in message
    assert "Expected [-1,3,-1], got [2,4,5]" in message


def test_batch_of_zero_is_rejected_naming_the_input() -> None:
    message = rejected(model(), body((0, 3, 5), (0, 2)))
    assert "input 'IMAGE' has batch size 0" in message


def test_batch_over_max_batch_size_is_rejected_naming_the_input() -> None:
    message = rejected(model(max_batch_size=4), body((5, 3, 5), (5, 2)))
    assert "input 'IMAGE' has batch size 5" in message
    assert "1 to 4" in message


def test_inputs_disagreeing_on_batch_size_are_rejected() -> None:
    message = rejected(model(), body((2, 3, 5), (3, 2)))
    assert "disagree on the batch size (2, 3)" in message
    assert "'clf'" in message


def test_unknown_requested_output_is_rejected_naming_it() -> None:
    message = rejected(model(), body(outputs=("SCORES", "PROBS")))
    assert "unknown output 'PROBS'" in message
    assert "LABEL, SCORES" in message


def test_unbatched_model_has_no_batch_dim() -> None:
    config = model(max_batch_size=0)
    assert check_request(config, body((3, 9), (2,))) == 1


def test_unbatched_model_rejects_a_leading_batch_dim() -> None:
    message = rejected(model(max_batch_size=0), body((1, 3, 9), (1, 2)))
    assert "unexpected shape for input 'IMAGE'" in message
    assert "Expected [3,-1], got [1,3,9]" in message


def test_unbatched_model_checks_fixed_dims() -> None:
    message = rejected(model(max_batch_size=0), body((3, 9), (4,)))
    assert "unexpected shape for input 'MASK'" in message and "got [4]" in message


POLICIES = {
    "priority_levels": 2,
    "default_queue_policy": {"default_timeout_microseconds": 2_000_000},
    "priority_queue_policy": {
        2: {"timeout_action": "DELAY", "default_timeout_microseconds": 500_000, "max_queue_size": 4}
    },
}


def test_a_rejecting_levels_timeout_lowers_the_deadline_a_delaying_ones_does_not() -> None:
    config = model(dynamic_batching=POLICIES)
    assert request_timeout_s(30.0, config, body(), 0) == 2.0
    assert request_timeout_s(30.0, config, body(), 1) == 30.0  # it waits behind the others
    timed = body()
    timed.parameters = {"timeout": 100_000}
    assert request_timeout_s(30.0, config, timed, 1) == 0.1  # the request's own still counts


def test_a_delaying_level_marks_when_a_request_moves_back_and_counts_it() -> None:
    config = model(dynamic_batching=POLICIES)
    request = InferRequest("r", "clf", "1", {}, "", 0, ts={Stamp.GATEWAY_IN: 10_000_000_000})
    fields: dict[bytes, bytes] = {}
    assert queue_fields(config, request, 1, fields, readmit=False) == 4
    assert fields == {wire.DELAY_AT: b"10500", wire.LEVEL_COUNTED: b"1"}
    again: dict[bytes, bytes] = {}
    assert queue_fields(config, request, 1, again, readmit=True) == 0  # admitted once
    assert queue_fields(config, request, 0, {}, readmit=False) == 0  # level 1: no bound of its own
