"""The plain-body parse (gateway.json_plain) against the general parse and check.

For every body below, plain or not, valid or not: when the plain parse takes it, the
general path (codec.parse_infer_body with the precheck, then validation.check_request)
takes it too, as the same tensors, id and batch size; when the plain parse raises, the
general path raises the same; and the bodies a client commonly sends are taken.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from gateway import codec, json_plain
from gateway.codec import InferBody
from gateway.validation import check_request, precheck_input
from weir.config import ModelConfig
from weir.errors import InvalidInput, WeirError


def config(max_batch_size: int = 8, **overrides: Any) -> ModelConfig:
    raw: dict[str, Any] = {
        "name": "two",
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "input": [
            {"name": "A", "data_type": "TYPE_FP32", "dims": [3]},
            {"name": "B", "data_type": "TYPE_FP16", "dims": [-1, 2]},
        ],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    raw.update(overrides)
    return ModelConfig.model_validate(raw)


BATCHED = config()
UNBATCHED = config(max_batch_size=0)


def inputs(batch: int = 2, b_rows: int = 1) -> list[dict[str, Any]]:
    return [
        {"name": "A", "shape": [batch, 3], "datatype": "FP32",
         "data": [0.5 * i for i in range(batch * 3)]},
        {"name": "B", "shape": [batch, b_rows, 2], "datatype": "FP16",
         "data": list(range(batch * b_rows * 2))},
    ]  # fmt: skip


def with_input(index: int, **changes: Any) -> dict[str, Any]:
    items = inputs()
    items[index] = {**items[index], **changes}
    return {"inputs": items}


BODIES: dict[str, Any] = {
    "plain": {"inputs": inputs()},
    "plain, batch 1": {"inputs": inputs(batch=1)},
    "plain, a variable dim": {"inputs": inputs(b_rows=5)},
    "an id": {"id": "req-1", "inputs": inputs()},
    "a null id": {"id": None, "inputs": inputs()},
    "inputs in the other order": {"inputs": inputs()[::-1]},
    "an id not a string": {"id": 7, "inputs": inputs()},
    "requested outputs": {"inputs": inputs(), "outputs": [{"name": "OUT"}]},
    "request parameters": {"inputs": inputs(), "parameters": {"priority": 1}},
    "an unknown top-level key": {"inputs": inputs(), "extra": 1},
    "input parameters": with_input(0, parameters={"x": 1}),
    "a missing input": {"inputs": inputs()[:1]},
    "a duplicate input": {"inputs": [inputs()[0], inputs()[0]]},
    "an unknown input": with_input(0, name="C"),
    "a name not a string": with_input(0, name=1),
    "a wrong datatype": with_input(0, datatype="FP64"),
    "an unknown datatype": with_input(0, datatype="FLOAT"),
    "a wrong dim": with_input(0, shape=[2, 4], data=[0.0] * 8),
    "a wrong rank": with_input(0, shape=[6], data=[0.0] * 6),
    "batch 0": {"inputs": inputs(batch=0)},
    "a batch past the most": {"inputs": inputs(batch=9)},
    "batches that disagree": {"inputs": [inputs(batch=2)[0], inputs(batch=3)[1]]},
    "a negative dim": with_input(1, shape=[2, -1, 2], data=[]),
    "a bool dim": with_input(0, shape=[True, 3], data=[0.0] * 3),
    "a float dim": with_input(0, shape=[2.0, 3], data=[0.0] * 6),
    "too few elements": with_input(0, data=[0.0] * 5),
    "too many elements": with_input(0, data=[0.0] * 7),
    "nested data": with_input(0, data=[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]),
    "bool data": with_input(0, data=[True, False, True, 0.0, 1.0, 2.0]),
    "string data": with_input(0, data=["a", 1.0, 2.0, 3.0, 4.0, 5.0]),
    "null data": with_input(0, data=[None, 1.0, 2.0, 3.0, 4.0, 5.0]),
    "data not a list": with_input(0, data=1.0),
    "shape not a list": with_input(0, shape="2,3"),
    "an input not an object": {"inputs": [1, inputs()[1]]},
    "inputs not a list": {"inputs": {"A": 1}},
    "no inputs": {"inputs": []},
    "an int past a double": with_input(0, data=[10**400, 1, 2, 3, 4, 5]),
    "FP16 past its range": with_input(1, data=[1e10, 0, 0, 0]),
    "binary data": with_input(0, parameters={"binary_data_size": 24}),
}


def general(raw: bytes, model: ModelConfig) -> tuple[InferBody, int]:
    precheck = functools.partial(precheck_input, model)
    body = codec.parse_infer_body(raw, None, precheck, None, model.name)
    return body, check_request(model, body)


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except WeirError as exc:
        return type(exc).__name__, exc.message


@pytest.mark.parametrize("model", [BATCHED, UNBATCHED], ids=["batched", "unbatched"])
@pytest.mark.parametrize("name", list(BODIES))
def test_what_the_plain_parse_takes_the_general_path_takes_alike(
    name: str, model: ModelConfig
) -> None:
    document = BODIES[name]
    if model is UNBATCHED:  # the same body without its batch dimension
        document = json.loads(json.dumps(document))
        for item in document.get("inputs", []):
            if isinstance(item, dict) and isinstance(item.get("shape"), list):
                item["shape"] = item["shape"][1:]
    raw = json.dumps(document).encode()
    plain = outcome(lambda: json_plain.parse(raw, model))
    expected = outcome(lambda: general(raw, model))
    if plain[0] != "ok":  # raised: as the general path raises
        assert plain == expected
        return
    if plain[1] is None:
        return  # the general path's to answer
    assert expected[0] == "ok", (name, expected)
    body, batch = expected[1]
    got = plain[1]
    assert got.batch == batch
    assert (got.id, got.outputs, got.parameters) == (body.id, body.outputs, body.parameters)
    assert got.inputs.keys() == body.inputs.keys()
    for key, tensor in body.inputs.items():
        assert got.inputs[key] == tensor, key


@pytest.mark.parametrize(
    "name", ["plain", "plain, batch 1", "plain, a variable dim", "an id", "a null id",
             "inputs in the other order"],
)  # fmt: skip
def test_common_bodies_take_the_plain_parse(name: str) -> None:
    body = json_plain.parse(json.dumps(BODIES[name]).encode(), BATCHED)
    assert body is not None and body.batch in (1, 2)
    assert check_request(BATCHED, body) == body.batch


def test_a_model_with_other_inputs_never_takes_it() -> None:
    raw = json.dumps(BODIES["plain"]).encode()
    ints = config(input=[{"name": "A", "data_type": "TYPE_INT64", "dims": [3]}])
    optional = config(input=[{"name": "A", "data_type": "TYPE_FP32", "dims": [3],
                              "optional": True}])  # fmt: skip
    limited = config(parameters={"max_input_bytes": {"string_value": "1000"}})
    for model in (ints, optional, limited):
        assert json_plain.parse(raw, model) is None


def test_past_a_datatypes_range_it_raises_as_the_general_path() -> None:
    raw = json.dumps(BODIES["FP16 past its range"]).encode()
    with pytest.raises(InvalidInput, match="does not fit FP16"):
        json_plain.parse(raw, BATCHED)
