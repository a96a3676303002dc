"""Ragged batching's pieces: each batch input kind, and the config's rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.weir.test_config import config_error, load, valid_raw
from weir.config_ragged import BatchInputKind
from weir.tensors import Tensor
from weir.wire import InferRequest
from workers.ragged import Ragged

RAGGED = {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, 2], "allow_ragged_batch": True}


def batch_input(kind: BatchInputKind, name: str = "B") -> dict[str, object]:
    return {
        "kind": kind.value,
        "target_name": [name],
        "data_type": "TYPE_INT32",
        "source_input": ["INPUT0"],
    }


def member(rows: int) -> InferRequest:
    array = np.zeros((1, rows, 2), np.float32)
    return InferRequest("r", "m", "1", {"INPUT0": Tensor.from_numpy(array)}, "", 0)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (BatchInputKind.ELEMENT_COUNT, [6, 2, 4]),
        (BatchInputKind.ACCUMULATED_ELEMENT_COUNT, [6, 8, 12]),
        (BatchInputKind.ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, [0, 6, 8, 12]),
        (BatchInputKind.MAX_ELEMENT_COUNT_AS_SHAPE, [0] * 6),
        (BatchInputKind.ITEM_SHAPE, [[3, 2], [1, 2], [2, 2]]),
        (BatchInputKind.ITEM_SHAPE_FLATTEN, [3, 2, 1, 2, 2, 2]),
    ],
)
def test_each_batch_input_kind_describes_the_batch_as_triton_does(
    tmp_path: Path, kind: BatchInputKind, expected: list[object]
) -> None:
    config = load(tmp_path, valid_raw(input=[RAGGED], batch_input=[batch_input(kind)]))
    members = [member(3), member(1), member(2)]
    ragged = Ragged(config.run_config())
    (computed,) = ragged.computed(members).values()
    assert computed.dtype == np.int32
    assert computed.tolist() == expected
    assert ragged.gather("INPUT0", members).shape == (12,)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_input": [batch_input(BatchInputKind.ELEMENT_COUNT, "INPUT0")]},
         "is also in input"),
        ({"batch_input": [{**batch_input(BatchInputKind.ELEMENT_COUNT), "source_input": ["X"]}]},
         "no input 'X'"),
        ({"batch_input": [{**batch_input(BatchInputKind.ELEMENT_COUNT), "data_type": "TYPE_FP16"}]},
         "TYPE_INT32, TYPE_INT64 or TYPE_FP32"),
        ({"batch_output": [{"target_name": ["NOPE"], "source_input": ["INPUT0"]}]},
         "not in output"),
        ({"max_batch_size": 0}, "needs max_batch_size > 0"),
    ],
)  # fmt: skip
def test_a_wrong_ragged_config_is_refused_naming_the_problem(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    error, _ = config_error(tmp_path, valid_raw(input=[RAGGED], **overrides))
    assert message in error
