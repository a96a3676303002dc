"""gRPC infer messages to Weir's tensors: raw and typed contents, every datatype, refusals."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway.grpc_codec import parse_infer_request, render_infer_response
from weir import datatypes
from weir.errors import InvalidInput
from weir.tensors import Tensor

TYPED = {
    "BOOL": ("bool_contents", np.array([[True, False, True]])),
    "INT8": ("int_contents", np.array([[-128, 0, 127]], np.int8)),
    "INT16": ("int_contents", np.array([[-32768, 1, 32767]], np.int16)),
    "INT32": ("int_contents", np.array([[-(2**31), 2, 2**31 - 1]], np.int32)),
    "INT64": ("int64_contents", np.array([[-(2**63), 3, 2**63 - 1]], np.int64)),
    "UINT8": ("uint_contents", np.array([[0, 4, 255]], np.uint8)),
    "UINT16": ("uint_contents", np.array([[0, 5, 65535]], np.uint16)),
    "UINT32": ("uint_contents", np.array([[0, 6, 2**32 - 1]], np.uint32)),
    "UINT64": ("uint64_contents", np.array([[0, 7, 2**64 - 1]], np.uint64)),
    "FP32": ("fp32_contents", np.array([[-1.5, 0.25, 3e38]], np.float32)),
    "FP64": ("fp64_contents", np.array([[-1.5, 0.1, 1e300]], np.float64)),
}


def request(datatype: str, shape: list[int], **tensor: Any) -> Any:
    message = service_pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="X", datatype=datatype, shape=shape, **tensor)
    return message


def only_input(message: Any) -> Tensor:
    return parse_infer_request(message).inputs["X"]


@pytest.mark.parametrize("datatype", sorted(TYPED))
def test_typed_contents_give_the_same_tensor_as_raw_bytes(datatype: str) -> None:
    field, array = TYPED[datatype]
    typed = request(datatype, list(array.shape))
    getattr(typed.inputs[0].contents, field).extend(array.reshape(-1).tolist())
    raw = request(datatype, list(array.shape))
    raw.raw_input_contents.append(array.astype(datatypes.numpy_dtype(datatype)).tobytes())
    assert only_input(typed) == only_input(raw) == Tensor.from_numpy(array, datatype)


def test_bytes_contents_and_raw_bytes_use_tritons_length_prefixes() -> None:
    elements = [b"hello", b"", "é".encode()]
    typed = request("BYTES", [3])
    typed.inputs[0].contents.bytes_contents.extend(elements)
    raw = request("BYTES", [3])
    raw.raw_input_contents.append(datatypes.serialize_bytes(elements))
    assert only_input(typed) == only_input(raw)
    assert list(only_input(typed).to_numpy()) == elements


def test_bf16_and_fp16_travel_raw_only() -> None:
    # bfloat16: the upper half of each float32.
    bf16 = (np.array([1.0, -2.0], np.float32).view("<u4") >> 16).astype("<u2").tobytes()
    raw = request("BF16", [2])
    raw.raw_input_contents.append(bf16)
    assert only_input(raw) == Tensor("BF16", (2,), bf16)
    for datatype in ("BF16", "FP16"):
        typed = request(datatype, [1])
        typed.inputs[0].contents.fp32_contents.append(1.0)
        with pytest.raises(InvalidInput, match="must be sent in raw_input_contents"):
            parse_infer_request(typed)


REFUSED = [
    pytest.param(lambda m: m.inputs[0].contents.int_contents.extend([300]), "do not fit", id="fit"),
    pytest.param(lambda m: m.inputs[0].contents.int_contents.extend([1, 2]), "has 2", id="count"),
    pytest.param(
        lambda m: (
            m.inputs[0].contents.int_contents.append(1),
            m.raw_input_contents.append(b"\x01"),
        ),
        "both contents and raw_input_contents",
        id="raw-and-typed",
    ),
    pytest.param(
        lambda m: m.raw_input_contents.append(b"\x01\x02"),
        "input byte size mismatch for input",
        id="size",
    ),
    pytest.param(
        lambda m: m.raw_input_contents.extend([b"\x01", b"\x02"]), "2 raw_input_contents", id="raw"
    ),
    pytest.param(
        lambda m: setattr(m.inputs[0].parameters["shared_memory_region"], "int64_param", 1),
        "Unable to parse 'shared_memory_region'",
        id="shared-memory",
    ),
    pytest.param(
        lambda m: (
            m.inputs.add(name="X", datatype="INT8", shape=[1]),
            m.raw_input_contents.extend([b"\x01", b"\x02"]),
        ),
        "more than once",
        id="twice",
    ),
    pytest.param(
        lambda m: setattr(m.inputs[0], "datatype", "FLOAT"), "unknown datatype", id="datatype"
    ),
    pytest.param(lambda m: m.inputs[0].shape.append(-1), "non-negative", id="negative-dim"),
    pytest.param(
        lambda m: m.inputs[0].shape.extend([2**40] * 2), "more than 2**48 elements", id="huge"
    ),
    pytest.param(
        lambda m: (
            m.raw_input_contents.append(b"\x01"),
            m.parameters["p"].CopyFrom(service_pb2.InferParameter()),
        ),
        "parameter 'p' has no value",
        id="parameter",
    ),
]


@pytest.mark.parametrize(("change", "message"), REFUSED)
def test_bad_requests_are_invalid_input_naming_the_problem(change: Any, message: str) -> None:
    bad = request("INT8", [1])
    change(bad)
    with pytest.raises(InvalidInput, match=re.escape(message)):
        parse_infer_request(bad)


def test_a_request_with_no_inputs_is_refused() -> None:
    with pytest.raises(InvalidInput, match="no inputs"):
        parse_infer_request(service_pb2.ModelInferRequest(model_name="m"))


def test_parameters_outputs_and_id_are_carried() -> None:
    message = request("INT8", [1])
    message.raw_input_contents.append(b"\x05")
    message.id = "abc"
    message.parameters["priority"].uint64_param = 2
    message.parameters["timeout"].int64_param = 500
    message.parameters["tag"].string_param = "x"
    message.outputs.add(name="Y")
    body = parse_infer_request(message)
    assert body.id == "abc"
    assert body.parameters == {"priority": 2, "timeout": 500, "tag": "x"}
    assert [o.name for o in body.outputs] == ["Y"]


def test_outputs_are_rendered_raw_in_order() -> None:
    first = Tensor.from_numpy(np.arange(4, dtype=np.float32).reshape(2, 2))
    second = Tensor.from_numpy(np.array([b"a", b"bc"], dtype=object))
    response = render_infer_response("m", "3", "id-1", [("B", second), ("A", first)])
    assert (response.model_name, response.model_version, response.id) == ("m", "3", "id-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("B", "BYTES", [2]),
        ("A", "FP32", [2, 2]),
    ]
    assert list(response.raw_output_contents) == [second.data, first.data]


# --- typed contents at scale: decoded in bulk, byte for byte what raw contents give ----------

LARGE = 100_000


def large_values(datatype: str) -> np.ndarray:
    """LARGE values over the datatype's whole range (so integers take every varint length)."""
    rng = np.random.default_rng(11)
    dtype = datatypes.numpy_dtype(datatype)
    if dtype.kind == "b":
        return rng.integers(0, 2, LARGE).astype(bool)
    if dtype.kind == "f":
        return rng.standard_normal(LARGE).astype(dtype) * dtype.type(1e3)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, LARGE, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("datatype", sorted(TYPED))
def test_large_typed_contents_give_the_same_tensor_as_raw_bytes(datatype: str) -> None:
    field, _ = TYPED[datatype]
    array = large_values(datatype)
    sent = request(datatype, [LARGE])
    getattr(sent.inputs[0].contents, field).extend(array.tolist())
    # What the gateway gets: a message parsed from the wire, as gRPC hands it over.
    typed = service_pb2.ModelInferRequest.FromString(sent.SerializeToString())
    raw = request(datatype, [LARGE])
    raw.raw_input_contents.append(array.tobytes())
    assert only_input(typed) == only_input(raw) == Tensor.from_numpy(array, datatype)


def test_large_bytes_contents_use_tritons_length_prefixes() -> None:
    rng = np.random.default_rng(12)
    elements = [rng.bytes(int(n)) for n in rng.integers(0, 300, LARGE)]
    elements[:3] = [b"", b"\x00" * 200, "é".encode()]
    sent = request("BYTES", [LARGE])
    sent.inputs[0].contents.bytes_contents.extend(elements)
    typed = service_pb2.ModelInferRequest.FromString(sent.SerializeToString())
    assert only_input(typed).data == datatypes.serialize_bytes(elements)
    assert list(only_input(typed).to_numpy()) == elements


def test_typed_contents_read_only_the_datatypes_field() -> None:
    typed = request("INT32", [3])
    typed.inputs[0].contents.int_contents.extend([1, -2, 3])
    typed.inputs[0].contents.fp32_contents.extend([9.0])  # another field: not this tensor's
    typed.inputs[0].contents.bytes_contents.extend([b"ignored"])
    assert only_input(typed) == Tensor.from_numpy(np.array([1, -2, 3], np.int32), "INT32")
