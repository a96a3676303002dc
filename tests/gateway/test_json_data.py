"""A float input's flat JSON data read in C (gateway.json_data.flat_floats) is what the
general path reads, and whatever that path refuses is still refused, with its words."""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.codec import parse_infer_body
from gateway.json_data import flat_floats, tensor_from_json
from weir.errors import InvalidInput

FLOATS = ["FP16", "FP32", "FP64"]


def _numbers(seed: int, count: int) -> list[Any]:
    rng = random.Random(seed)
    pool = [
        lambda: rng.uniform(-1, 1),
        lambda: rng.uniform(-6e4, 6e4),
        lambda: rng.randint(-(2**40), 2**40),
        lambda: rng.choice([0, 1, -0.0, 0.5, 1e-8, 3.4e38, -65504.0, 2**24 + 1, 5e-324]),
    ]
    return [rng.choice(pool)() for _ in range(count)]


@pytest.mark.parametrize("datatype", FLOATS)
@pytest.mark.parametrize("seed", range(20))
def test_flat_numbers_read_in_c_are_the_bytes_numpy_makes_of_them(datatype: str, seed: int) -> None:
    data = _numbers(seed, 257)
    if datatype == "FP16":
        data = [v if abs(v) <= 65504 else v / 1e35 for v in data]
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    with np.errstate(over="raise"):
        expected = np.array(data, dtype=dtype).tobytes()
    assert flat_floats("x", datatype, data) == expected
    fast = tensor_from_json("x", datatype, (1, 257), data, bool_free=True)
    general = tensor_from_json("x", datatype, (1, 257), data, bool_free=False)
    assert fast.data == general.data == expected


def test_only_float_datatypes_and_plain_numbers_take_the_path_in_c() -> None:
    assert flat_floats("x", "INT64", [1, 2]) is None
    assert flat_floats("x", "BOOL", [True]) is None
    for odd in (["1.0"], [None], [[1.0]], [{"v": 1}], [10**400]):
        assert flat_floats("x", "FP32", odd) is None


def _message(body: dict[str, Any]) -> str:
    with pytest.raises(InvalidInput) as info:
        parse_infer_body(json.dumps(body).encode(), None)
    return info.value.message


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("1.0", "'1.0' is not a valid FP32 value"),
        (None, "None is not a valid FP32 value"),
        (True, "True is not a valid FP32 value"),
        (2**1000, "data does not fit FP32"),
        (1e39, "data does not fit FP32"),
    ],
)
def test_a_flat_float_input_refuses_what_the_general_path_refuses(value: Any, words: str) -> None:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [3], "data": [0.5, value, 2]}
    message = _message({"inputs": [tensor]})
    assert "input 'INPUT0'" in message
    assert words in message


def test_fp16_overflow_is_refused_on_the_path_in_c() -> None:
    tensor = {"name": "INPUT0", "datatype": "FP16", "shape": [2], "data": [1.0, 70000.0]}
    assert "data does not fit FP16" in _message({"inputs": [tensor]})


def test_a_body_with_a_bool_anywhere_reads_its_floats_the_general_way_alike() -> None:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 0.25]}
    plain = parse_infer_body(orjson.dumps({"inputs": [tensor]}), None)
    outputs = [{"name": "OUT", "parameters": {"binary_data": True}}]
    with_bool = parse_infer_body(orjson.dumps({"inputs": [tensor], "outputs": outputs}), None)
    assert plain.inputs["INPUT0"].data == with_bool.inputs["INPUT0"].data
    np.testing.assert_array_equal(plain.inputs["INPUT0"].to_numpy(), [1.0, 0.25])
