"""Unit tests for KServe v2 infer bodies (gateway.codec): JSON and binary, both ways."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.codec import RequestedOutput, parse_infer_body, render_infer_response
from weir import datatypes
from weir.errors import InvalidInput
from weir.tensors import Tensor


def json_body(inputs: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"inputs": inputs, **extra})


def binary_body(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(chunks), len(head)


def invalid(body: bytes, header_length: int | None = None) -> str:
    """Parse a body that must be rejected; return the InvalidInput message."""
    with pytest.raises(InvalidInput) as info:
        parse_infer_body(body, header_length)
    return info.value.message


def one_input(**fields: Any) -> bytes:
    return json_body([{"name": "INPUT0", **fields}])


# --- JSON bodies ------------------------------------------------------------------------------


def test_flat_and_nested_json_data_give_the_same_tensor() -> None:
    flat = parse_infer_body(
        one_input(datatype="INT32", shape=[2, 3], data=[1, 2, 3, 4, 5, 6]), None
    )
    nested = parse_infer_body(
        one_input(datatype="INT32", shape=[2, 3], data=[[1, 2, 3], [4, 5, 6]]), None
    )

    assert flat.inputs["INPUT0"] == nested.inputs["INPUT0"]
    tensor = flat.inputs["INPUT0"]
    assert tensor.shape == (2, 3)
    assert tensor.to_numpy().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_json_fp32_accepts_integers_and_floats() -> None:
    body = parse_infer_body(one_input(datatype="FP32", shape=[3], data=[1, 2.5, -0.25]), None)
    assert body.inputs["INPUT0"].to_numpy().tolist() == [1.0, 2.5, -0.25]
    assert body.inputs["INPUT0"].to_numpy().dtype == np.float32


def test_json_bool_tensor() -> None:
    body = parse_infer_body(one_input(datatype="BOOL", shape=[2], data=[True, False]), None)
    assert body.inputs["INPUT0"].to_numpy().tolist() == [True, False]


def test_json_uint8_edges_fit() -> None:
    body = parse_infer_body(one_input(datatype="UINT8", shape=[2], data=[0, 255]), None)
    assert body.inputs["INPUT0"].data == b"\x00\xff"


def test_bytes_input_from_json_strings_is_utf8_serialized() -> None:
    body = parse_infer_body(one_input(datatype="BYTES", shape=[3], data=["ab", "", "é"]), None)
    tensor = body.inputs["INPUT0"]
    assert tensor.datatype == "BYTES"
    assert tensor.data == datatypes.serialize_bytes([b"ab", b"", "é".encode()])


def test_request_id_and_parameters_are_parsed() -> None:
    body = parse_infer_body(
        json_body(
            [{"name": "X", "datatype": "INT8", "shape": [1], "data": [1]}],
            id="abc-1",
            parameters={"binary_data_output": True},
        ),
        None,
    )
    assert body.id == "abc-1"
    assert body.binary_output_default is True


def test_request_without_id_has_none_and_json_output_default() -> None:
    body = parse_infer_body(one_input(datatype="INT8", shape=[1], data=[1]), None)
    assert body.id is None
    assert body.outputs == []
    assert body.binary_output_default is False


def test_requested_outputs_with_binary_data_parameter_are_parsed() -> None:
    body = parse_infer_body(
        json_body(
            [{"name": "X", "datatype": "INT8", "shape": [1], "data": [1]}],
            outputs=[
                {"name": "A", "parameters": {"binary_data": True}},
                {"name": "B", "parameters": {"binary_data": False}},
                {"name": "C"},
            ],
        ),
        None,
    )
    assert body.outputs == [
        RequestedOutput("A", True),
        RequestedOutput("B", False),
        RequestedOutput("C", None),
    ]


def test_header_length_equal_to_body_means_no_binary_part() -> None:
    body = one_input(datatype="INT8", shape=[1], data=[7])
    assert parse_infer_body(body, len(body)).inputs["INPUT0"].data == b"\x07"


# --- binary bodies ----------------------------------------------------------------------------


def test_binary_body_with_binary_and_json_inputs_in_json_order() -> None:
    first = np.arange(6, dtype=np.float32).reshape(2, 3)
    third = np.array([[1, 2]], dtype=np.int64)
    header = {
        "inputs": [
            {
                "name": "A",
                "datatype": "FP32",
                "shape": [2, 3],
                "parameters": {"binary_data_size": first.nbytes},
            },
            {"name": "B", "datatype": "INT32", "shape": [2], "data": [7, 8]},
            {
                "name": "C",
                "datatype": "INT64",
                "shape": [1, 2],
                "parameters": {"binary_data_size": third.nbytes},
            },
        ]
    }
    raw, length = binary_body(header, first.tobytes(), third.tobytes())

    body = parse_infer_body(raw, length)

    assert list(body.inputs) == ["A", "B", "C"]
    assert np.array_equal(body.inputs["A"].to_numpy(), first)
    assert body.inputs["B"].to_numpy().tolist() == [7, 8]
    assert np.array_equal(body.inputs["C"].to_numpy(), third)


def test_binary_bytes_and_bf16_inputs_keep_their_raw_data() -> None:
    strings = datatypes.serialize_bytes([b"\x00bin", b""])
    bf16 = b"\x80\x3f\x00\xc0"
    header = {
        "inputs": [
            {
                "name": "S",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": len(strings)},
            },
            {"name": "H", "datatype": "BF16", "shape": [2], "parameters": {"binary_data_size": 4}},
        ]
    }
    raw, length = binary_body(header, strings, bf16)

    body = parse_infer_body(raw, length)

    assert body.inputs["S"].to_numpy().tolist() == [b"\x00bin", b""]
    assert body.inputs["H"].data == bf16


def test_header_length_beyond_the_body_is_rejected() -> None:
    raw = one_input(datatype="INT8", shape=[1], data=[1])
    message = invalid(raw, len(raw) + 1)
    assert "Inference-Header-Content-Length" in message
    assert f"{len(raw) + 1}" in message


def test_header_length_short_of_the_json_is_rejected() -> None:
    raw = one_input(datatype="INT8", shape=[1], data=[1])
    # The header cut one byte short is not valid JSON, and the extra byte is left over.
    assert "not valid JSON" in invalid(raw, len(raw) - 1)


@pytest.mark.parametrize("header_length", [0, -5])
def test_zero_or_negative_header_length_is_rejected(header_length: int) -> None:
    raw = one_input(datatype="INT8", shape=[1], data=[1])
    assert "Inference-Header-Content-Length" in invalid(raw, header_length)


def test_binary_data_size_past_the_end_is_rejected_naming_the_input() -> None:
    header = {
        "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}
        ]
    }
    raw, length = binary_body(header, bytes(4))
    message = invalid(raw, length)
    assert "'A'" in message
    assert "runs past the end" in message


def test_trailing_binary_bytes_no_input_claims_are_rejected() -> None:
    header = {
        "inputs": [
            {"name": "A", "datatype": "INT8", "shape": [2], "parameters": {"binary_data_size": 2}}
        ]
    }
    raw, length = binary_body(header, b"\x01\x02", b"\x03")
    assert "1 bytes of binary data that no input claims" in invalid(raw, length)


def test_binary_data_size_mismatching_shape_is_rejected_naming_the_input() -> None:
    header = {
        "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 8}}
        ]
    }
    raw, length = binary_body(header, bytes(8))
    message = invalid(raw, length)
    assert "input byte size mismatch for input 'A'" in message
    assert "Expected 12, got 8" in message


@pytest.mark.parametrize("size", [-1, 1.5, True, "4"])
def test_bad_binary_data_size_is_rejected_naming_the_input(size: Any) -> None:
    header = {
        "inputs": [
            {
                "name": "A",
                "datatype": "INT8",
                "shape": [1],
                "parameters": {"binary_data_size": size},
            }
        ]
    }
    raw, length = binary_body(header, b"\x01")
    assert "input 'A': binary_data_size" in invalid(raw, length)


def test_input_without_data_or_binary_size_is_rejected() -> None:
    assert "input 'INPUT0' has neither" in invalid(one_input(datatype="INT8", shape=[1]))


# --- malformed headers ------------------------------------------------------------------------


def test_malformed_json_is_rejected() -> None:
    assert "not valid JSON" in invalid(b'{"inputs": [')


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"3"])
def test_json_that_is_not_an_object_is_rejected(raw: bytes) -> None:
    assert "must be a JSON object" in invalid(raw)


@pytest.mark.parametrize("inputs", [{"name": "A"}, "A", [1, 2]])
def test_inputs_not_a_list_of_objects_is_rejected(inputs: Any) -> None:
    assert "'inputs' must be a list of objects" in invalid(orjson.dumps({"inputs": inputs}))


def test_request_without_inputs_is_rejected() -> None:
    assert "no inputs" in invalid(b'{"inputs": []}')
    assert "no inputs" in invalid(b"{}")


@pytest.mark.parametrize("name", [None, "", 3])
def test_input_without_a_name_string_is_rejected(name: Any) -> None:
    fields = {"datatype": "INT8", "shape": [1], "data": [1]}
    if name is not None:
        fields["name"] = name
    assert "needs a 'name' string" in invalid(json_body([fields]))


def test_duplicate_input_name_is_rejected() -> None:
    spec = {"name": "A", "datatype": "INT8", "shape": [1], "data": [1]}
    assert "input 'A' appears more than once" in invalid(json_body([spec, spec]))


@pytest.mark.parametrize("datatype", ["FLOAT32", "TYPE_FP32", None, "fp32"])
def test_unknown_datatype_is_rejected_naming_the_input(datatype: Any) -> None:
    message = invalid(one_input(datatype=datatype, shape=[1], data=[1]))
    assert "input 'INPUT0'" in message
    assert "unknown datatype" in message


@pytest.mark.parametrize("shape", [3, "3", [2, -1], [1.5], [True], None])
def test_bad_shape_is_rejected_naming_the_input(shape: Any) -> None:
    message = invalid(one_input(datatype="INT32", shape=shape, data=[1, 2]))
    assert "input 'INPUT0': shape" in message


def test_element_count_mismatch_is_rejected_naming_the_input() -> None:
    message = invalid(one_input(datatype="INT32", shape=[2, 2], data=[1, 2, 3]))
    assert "input 'INPUT0'" in message
    assert "needs 4 elements, data has 3" in message


@pytest.mark.parametrize(
    ("datatype", "value"),
    [
        ("INT32", 1.5),
        ("INT32", 2.0),
        ("INT32", True),
        ("INT32", "1"),
        ("FP32", "1.0"),
        ("FP32", None),
        ("BOOL", 1),
        ("UINT8", {"v": 1}),
    ],
)
def test_json_value_of_the_wrong_kind_is_rejected_naming_the_input(
    datatype: str, value: Any
) -> None:
    message = invalid(one_input(datatype=datatype, shape=[2], data=[[0], value]))
    assert "input 'INPUT0'" in message


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("UINT8", 256), ("UINT8", -1), ("INT8", 128), ("INT64", 2**63), ("UINT64", -1)],
)
def test_integer_overflowing_its_datatype_is_rejected_naming_the_input(
    datatype: str, value: int
) -> None:
    message = invalid(one_input(datatype=datatype, shape=[1], data=[value]))
    assert "input 'INPUT0'" in message
    assert f"does not fit {datatype}" in message


def test_float_overflowing_fp32_is_rejected_naming_the_input() -> None:
    message = invalid(one_input(datatype="FP32", shape=[1], data=[1e39]))
    assert "input 'INPUT0'" in message


def test_bf16_json_data_is_rejected_naming_the_input() -> None:
    message = invalid(one_input(datatype="BF16", shape=[1], data=[1.0]))
    assert "input 'INPUT0'" in message
    assert "binary data extension" in message


def test_bytes_json_element_that_is_not_a_string_is_rejected() -> None:
    message = invalid(one_input(datatype="BYTES", shape=[2], data=["a", 1]))
    assert "input 'INPUT0'" in message
    assert "must be strings" in message


def test_non_string_request_id_is_rejected() -> None:
    raw = json_body([{"name": "A", "datatype": "INT8", "shape": [1], "data": [1]}], id=5)
    assert "'id' must be a string" in invalid(raw)


def test_input_parameters_not_an_object_is_rejected_naming_the_input() -> None:
    assert "input 'INPUT0' 'parameters'" in invalid(
        one_input(datatype="INT8", shape=[1], data=[1], parameters=[1])
    )


def test_requested_output_without_name_is_rejected() -> None:
    raw = json_body(
        [{"name": "A", "datatype": "INT8", "shape": [1], "data": [1]}], outputs=[{"x": 1}]
    )
    assert "requested output needs a 'name'" in invalid(raw)


# --- rendering responses ----------------------------------------------------------------------


def test_json_outputs_render_their_values_and_echo_the_id() -> None:
    fp = Tensor.from_numpy(np.array([[0.5, -1.0], [2.0, 3.25]], dtype=np.float32))
    ints = Tensor.from_numpy(np.array([1, -2, 3], dtype=np.int64))
    text = Tensor.from_numpy(np.array([b"hi", "é".encode()], dtype=object))

    body, header_length = render_infer_response(
        "m", "2", "req-9", [("F", fp, False), ("I", ints, False), ("S", text, False)]
    )

    assert header_length is None
    response = orjson.loads(body)
    assert response["model_name"] == "m"
    assert response["model_version"] == "2"
    assert response["id"] == "req-9"
    assert response["outputs"] == [
        {"name": "F", "datatype": "FP32", "shape": [2, 2], "data": [0.5, -1.0, 2.0, 3.25]},
        {"name": "I", "datatype": "INT64", "shape": [3], "data": [1, -2, 3]},
        {"name": "S", "datatype": "BYTES", "shape": [2], "data": ["hi", "é"]},
    ]


def test_response_without_request_id_has_no_id_field() -> None:
    tensor = Tensor.from_numpy(np.array([True, False]))
    body, _ = render_infer_response("m", "1", None, [("B", tensor, False)])
    response = orjson.loads(body)
    assert "id" not in response
    assert response["outputs"][0]["data"] == [True, False]


def test_binary_output_follows_the_json_header() -> None:
    values = np.arange(4, dtype=np.float32)
    binary = Tensor.from_numpy(values)
    plain = Tensor.from_numpy(np.array([9], dtype=np.int32))

    body, header_length = render_infer_response(
        "m", "1", "r", [("BIN", binary, True), ("TXT", plain, False)]
    )

    assert header_length is not None
    header = orjson.loads(body[:header_length])
    assert body[header_length:] == values.tobytes()
    bin_out, txt_out = header["outputs"]
    assert bin_out == {
        "name": "BIN",
        "datatype": "FP32",
        "shape": [4],
        "parameters": {"binary_data_size": 16},
    }
    assert "data" not in bin_out
    assert txt_out["data"] == [9]


def test_two_binary_outputs_follow_in_order() -> None:
    a = Tensor("INT8", (2,), b"\x01\x02")
    b = Tensor("BYTES", (1,), datatypes.serialize_bytes([b"\xff\x00"]))

    body, header_length = render_infer_response("m", "1", None, [("A", a, True), ("B", b, True)])

    assert header_length is not None
    header = orjson.loads(body[:header_length])
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [2, 6]
    assert body[header_length:] == a.data + b.data


def test_bf16_output_is_always_binary() -> None:
    tensor = Tensor("BF16", (2,), b"\x80\x3f\x00\xc0")

    body, header_length = render_infer_response("m", "1", None, [("H", tensor, False)])

    assert header_length is not None
    header = orjson.loads(body[:header_length])
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert body[header_length:] == tensor.data


def test_rendered_binary_response_parses_back_as_the_same_tensors() -> None:
    tensor = Tensor.from_numpy(np.array([[1, 2], [3, 4]], dtype=np.uint16))
    body, header_length = render_infer_response("m", "1", None, [("OUT", tensor, True)])
    assert header_length is not None

    # A rendered output has the same shape as a binary input: reparse it as a request.
    header = orjson.loads(body[:header_length])
    header["inputs"] = header.pop("outputs")
    raw, length = binary_body(header, body[header_length:])

    assert parse_infer_body(raw, length).inputs["OUT"] == tensor


def test_nan_and_infinity_tokens_parse_as_triton_reads_them() -> None:
    body = (
        b'{"id": "NaN", "inputs": [{"name": "x", "datatype": "FP32", "shape": [4],'
        b' "data": [NaN, Infinity, -Infinity, 0.5]}]}'
    )
    parsed = parse_infer_body(body, None)
    assert parsed.id == "NaN"  # a string stays a string
    data = parsed.inputs["x"].to_numpy()
    assert np.isnan(data[0]) and data[1] == np.inf and data[2] == -np.inf and data[3] == 0.5


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [NaN, 1e999]}]}',
        b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [NaN]}]}',
        b'{"id": "\\udc00", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
        b'"data": [NaN]}]}',
        b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [nan]}]}',
    ],
)
def test_non_finite_bodies_stay_strict_otherwise(body: bytes) -> None:
    invalid(body)


def test_non_finite_outputs_render_as_triton_writes_them() -> None:
    odd = Tensor.from_numpy(np.array([[1.5, np.nan], [np.inf, -np.inf]], dtype=np.float32))
    plain = Tensor.from_numpy(np.array([0.25, 2.0], dtype=np.float64))
    body, header_length = render_infer_response(
        "m", "1", "r", [("odd", odd, False), ("plain", plain, False), ("again", odd, False)]
    )
    assert header_length is None
    assert body.count(b"[1.5,NaN,Infinity,-Infinity]") == 2
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs["plain"] == [0.25, 2.0]
    for name in ("odd", "again"):
        first, missing, *infinite = outputs[name]
        assert first == 1.5 and np.isnan(missing) and infinite == [np.inf, -np.inf]


def test_a_null_in_the_text_only_takes_the_looking_path_and_renders_the_same() -> None:
    # Finite data renders without looking into it; a "null" anywhere in the header (here
    # a string) makes the renderer look into each float tensor: the same bytes come out.
    plain = Tensor.from_numpy(np.array([[0.1, 3.0]], dtype=np.float32))
    words = Tensor.from_numpy(np.array([b"null"], dtype=object), "BYTES")
    body, _ = render_infer_response("m", "1", "null", [("p", plain, False), ("w", words, False)])
    assert json.loads(body) == {
        "model_name": "m", "model_version": "1", "id": "null",
        "outputs": [
            {"name": "p", "datatype": "FP32", "shape": [1, 2], "data": [0.1, 3.0]},
            {"name": "w", "datatype": "BYTES", "shape": [1], "data": ["null"]},
        ],
    }  # fmt: skip
    assert b'"data":[0.1,3.0]' in body  # FP32 written as float32's shortest form
