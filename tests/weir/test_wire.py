"""Unit tests for tensors on the mesh wire: datatypes, Tensor, InferRequest/InferReply."""

from __future__ import annotations

import struct
from collections.abc import Callable

import msgpack
import numpy as np
import pytest

from weir import datatypes
from weir.errors import (
    BodyTooLarge,
    DeadlineExceeded,
    ErrorKind,
    InvalidInput,
    NotFound,
    ServerError,
    Unavailable,
    WeirError,
)
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest, decode_batch, encode_batch


def edge_array(datatype: str) -> np.ndarray:
    """A 2x3 array of ``datatype`` holding its edge values."""
    dtype = datatypes.NUMPY_DTYPES[datatype]
    if dtype.kind == "b":
        values: list[object] = [True, False, True, True, False, False]
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
    else:
        finfo = np.finfo(dtype)
        values = [np.nan, np.inf, -np.inf, -0.0, finfo.max, finfo.tiny]
    return np.array(values, dtype=dtype).reshape(2, 3)


def request_with(inputs: dict[str, Tensor]) -> InferRequest:
    return InferRequest(
        id="req-1",
        model="m",
        version="1",
        inputs=inputs,
        reply_to="weir:replies:gw-1",
        deadline_ms=1_700_000_000_000,
        outputs=["OUT"],
        parameters={"priority": 1, "flag": True},
        ts={"gateway_in": 123},
    )


def round_trip_request(tensor: Tensor) -> Tensor:
    return InferRequest.decode(request_with({"X": tensor}).encode()).inputs["X"]


def round_trip_reply(tensor: Tensor) -> Tensor:
    reply = InferReply("req-1", "m", "1", outputs={"Y": tensor})
    return InferReply.decode(reply.encode()).outputs["Y"]


RoundTrip = Callable[[Tensor], Tensor]
NUMERIC = sorted(datatypes.NUMPY_DTYPES)
ROUND_TRIPS = [round_trip_request, round_trip_reply]


def test_every_datatype_is_covered_by_these_tests() -> None:
    assert {*NUMERIC, datatypes.BYTES, datatypes.BF16} == datatypes.DATATYPES


# --- numeric tensors --------------------------------------------------------------------------


@pytest.mark.parametrize("round_trip", ROUND_TRIPS, ids=["request", "reply"])
@pytest.mark.parametrize("datatype", NUMERIC)
def test_numeric_tensor_round_trips_bit_exactly(datatype: str, round_trip: RoundTrip) -> None:
    array = edge_array(datatype)
    tensor = Tensor.from_numpy(array)
    assert tensor.datatype == datatype

    back = round_trip(tensor)

    assert back == tensor
    assert back.shape == (2, 3)
    restored = back.to_numpy()
    assert restored.dtype == datatypes.NUMPY_DTYPES[datatype]
    assert restored.tobytes() == array.tobytes()
    assert np.array_equal(restored, array, equal_nan=array.dtype.kind == "f")


@pytest.mark.parametrize("datatype", NUMERIC)
def test_from_numpy_writes_little_endian_bytes(datatype: str) -> None:
    array = edge_array(datatype)
    big_endian = array.astype(array.dtype.newbyteorder(">"))

    tensor = Tensor.from_numpy(big_endian)

    assert tensor.datatype == datatype
    assert tensor.data == array.astype(array.dtype.newbyteorder("<")).tobytes()


def test_from_numpy_of_non_contiguous_array_is_row_major() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T
    tensor = Tensor.from_numpy(array)
    assert tensor.shape == (3, 2)
    assert np.array_equal(tensor.to_numpy(), array)


def test_scalar_and_empty_tensors_round_trip() -> None:
    scalar = Tensor.from_numpy(np.array(7, dtype=np.int64))
    empty = Tensor.from_numpy(np.zeros((0, 4), dtype=np.float32))

    assert round_trip_request(scalar).to_numpy() == 7
    assert round_trip_request(scalar).shape == ()
    assert round_trip_reply(empty).to_numpy().shape == (0, 4)
    assert round_trip_reply(empty).data == b""


def test_bf16_round_trips_as_raw_two_byte_words() -> None:
    # 1.0, -2.0, +inf, NaN, smallest subnormal, -0.0 as bfloat16 words.
    words = [0x3F80, 0xC000, 0x7F80, 0x7FC1, 0x0001, 0x8000]
    data = struct.pack("<6H", *words)
    tensor = Tensor(datatypes.BF16, (2, 3), data)
    tensor.check_size()

    for round_trip in ROUND_TRIPS:
        back = round_trip(tensor)
        assert back.datatype == datatypes.BF16
        assert back.shape == (2, 3)
        assert back.data == data


def test_bf16_has_no_numpy_view() -> None:
    with pytest.raises(InvalidInput, match="BF16"):
        Tensor(datatypes.BF16, (1,), b"\x80\x3f").to_numpy()


# --- BYTES tensors ----------------------------------------------------------------------------


BYTES_ELEMENTS = [b"", "héllo wörld ✓".encode(), b"\x00", b"\x00\xff\x01binary\x00", b"plain", b""]


@pytest.mark.parametrize("round_trip", ROUND_TRIPS, ids=["request", "reply"])
def test_bytes_tensor_round_trips_empty_unicode_and_binary_elements(round_trip: RoundTrip) -> None:
    array = np.empty(len(BYTES_ELEMENTS), dtype=object)
    array[:] = BYTES_ELEMENTS
    tensor = Tensor.from_numpy(array.reshape(3, 2))
    assert tensor.datatype == datatypes.BYTES

    back = round_trip(tensor)

    assert back == tensor
    restored = back.to_numpy()
    assert restored.shape == (3, 2)
    assert restored.reshape(-1).tolist() == BYTES_ELEMENTS
    assert all(type(e) is bytes for e in restored.reshape(-1))


def test_bytes_from_str_elements_are_utf8_encoded() -> None:
    array = np.array(["", "ü", "日本"], dtype=object)
    tensor = Tensor.from_numpy(array)
    assert tensor.to_numpy().tolist() == [b"", "ü".encode(), "日本".encode()]


def test_numpy_unicode_array_is_bytes_datatype() -> None:
    tensor = Tensor.from_numpy(np.array(["ab", "ç"]))
    assert tensor.datatype == datatypes.BYTES
    assert tensor.to_numpy().tolist() == [b"ab", "ç".encode()]


def test_bytes_serialization_is_triton_length_prefixed_little_endian() -> None:
    serialized = datatypes.serialize_bytes([b"ab", b"", b"\x00\x01\x02"])
    assert serialized == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x03\x00\x00\x00\x00\x01\x02"
    )
    assert datatypes.deserialize_bytes(serialized, 3) == [b"ab", b"", b"\x00\x01\x02"]


def test_bytes_tensor_data_is_triton_serialization() -> None:
    tensor = Tensor.from_numpy(np.array([b"hi", b"\x00"], dtype=object))
    assert tensor.data == b"\x02\x00\x00\x00hi\x01\x00\x00\x00\x00"


def test_deserialize_bytes_rejects_truncated_length_prefix() -> None:
    with pytest.raises(InvalidInput, match="length prefix"):
        datatypes.deserialize_bytes(b"\x01\x00\x00\x00a\x02\x00")


def test_deserialize_bytes_rejects_element_running_past_the_end() -> None:
    with pytest.raises(InvalidInput, match="past the end"):
        datatypes.deserialize_bytes(b"\x05\x00\x00\x00abc")


def test_deserialize_bytes_rejects_wrong_element_count() -> None:
    data = datatypes.serialize_bytes([b"a", b"b"])
    with pytest.raises(InvalidInput, match="holds 2 elements, shape needs 3"):
        datatypes.deserialize_bytes(data, 3)


def test_deserialize_bytes_accepts_memoryview() -> None:
    data = datatypes.serialize_bytes([b"x", b"yz"])
    assert datatypes.deserialize_bytes(memoryview(data), 2) == [b"x", b"yz"]


# --- Tensor.check_size ------------------------------------------------------------------------


def test_check_size_accepts_exact_byte_length() -> None:
    Tensor("FP32", (2, 3), bytes(24)).check_size()
    Tensor("BF16", (4,), bytes(8)).check_size()
    Tensor("BYTES", (2,), datatypes.serialize_bytes([b"a", b""])).check_size()


@pytest.mark.parametrize(
    ("datatype", "shape", "size", "needs"),
    [("FP32", (2, 3), 23, 24), ("INT64", (2,), 24, 16), ("BOOL", (3,), 0, 3), ("BF16", (2,), 2, 4)],
)
def test_check_size_rejects_wrong_byte_length(
    datatype: str, shape: tuple[int, ...], size: int, needs: int
) -> None:
    with pytest.raises(InvalidInput) as info:
        Tensor(datatype, shape, bytes(size)).check_size("X", "m")
    assert info.value.message == (
        f"input byte size mismatch for input 'X' for model 'm'. Expected {needs}, got {size}"
    )


def test_check_size_rejects_bytes_tensor_with_wrong_count() -> None:
    with pytest.raises(InvalidInput) as info:
        Tensor("BYTES", (3,), datatypes.serialize_bytes([b"a"])).check_size("T", "m")
    assert info.value.message == (
        "unexpected number of string elements 1 for inference input 'T' for model 'm', expecting 3"
    )


def test_check_size_rejects_bytes_tensor_with_broken_framing() -> None:
    with pytest.raises(InvalidInput, match="past the end"):
        Tensor("BYTES", (1,), b"\x09\x00\x00\x00abc").check_size()


# --- datatypes helpers ------------------------------------------------------------------------


def test_element_sizes() -> None:
    assert datatypes.element_size("BOOL") == 1
    assert datatypes.element_size("FP16") == 2
    assert datatypes.element_size("BF16") == 2
    assert datatypes.element_size("UINT64") == 8
    assert datatypes.element_size("BYTES") is None


def test_config_and_protocol_names_map_both_ways() -> None:
    assert datatypes.CONFIG_TO_PROTOCOL["TYPE_STRING"] == "BYTES"
    assert datatypes.PROTOCOL_TO_CONFIG["BYTES"] == "TYPE_STRING"
    for name in datatypes.DATATYPES:
        assert datatypes.CONFIG_TO_PROTOCOL[datatypes.PROTOCOL_TO_CONFIG[name]] == name


def test_numpy_dtype_without_kserve_datatype_is_invalid() -> None:
    with pytest.raises(InvalidInput, match="complex"):
        datatypes.datatype_of(np.zeros(2, dtype=np.complex64))


# --- requests and replies ---------------------------------------------------------------------


def test_request_round_trips_every_field() -> None:
    tensors = {
        "A": Tensor.from_numpy(np.arange(4, dtype=np.float32).reshape(2, 2)),
        "B": Tensor.from_numpy(np.array([b"x", b"yz"], dtype=object)),
    }
    request = request_with(tensors)

    back = InferRequest.decode(request.encode())

    assert back == request
    assert list(back.inputs) == ["A", "B"]


def test_reply_with_error_round_trips_and_has_no_outputs() -> None:
    request = request_with({})
    reply = InferReply.failure(request, DeadlineExceeded("too slow"))

    back = InferReply.decode(reply.encode())

    assert back.id == "req-1"
    assert back.error == ("timeout", "too slow")
    assert back.outputs == {}


@pytest.mark.parametrize(
    "error_class",
    [InvalidInput, NotFound, BodyTooLarge, Unavailable, DeadlineExceeded, ServerError],
)
def test_reply_error_raises_the_same_error_class_after_the_wire(
    error_class: type[WeirError],
) -> None:
    reply = InferReply.failure(request_with({}), error_class("what happened"))
    back = InferReply.decode(reply.encode())

    with pytest.raises(error_class) as info:
        back.raise_for_error()
    assert type(info.value) is error_class
    assert info.value.message == "what happened"


def test_timeout_kind_raises_deadline_exceeded_with_504() -> None:
    reply = InferReply("r", "m", "1", error=("timeout", "deadline passed"))
    with pytest.raises(DeadlineExceeded) as info:
        reply.raise_for_error()
    assert info.value.http_status == 504


def test_unknown_error_kind_raises_server_error() -> None:
    reply = InferReply("r", "m", "1", error=("mystery", "boom"))
    with pytest.raises(ServerError, match="boom"):
        reply.raise_for_error()


def test_reply_without_error_does_not_raise() -> None:
    reply = InferReply("r", "m", "1", outputs={"Y": Tensor("INT8", (1,), b"\x01")})
    back = InferReply.decode(reply.encode())
    back.raise_for_error()
    assert back.error is None
    assert back.outputs["Y"].data == b"\x01"


def test_every_error_kind_maps_to_its_class() -> None:
    for kind in ErrorKind:
        assert WeirError.of_kind(kind.value, "m").kind is kind


def test_decode_rejects_a_payload_that_is_not_a_map() -> None:
    with pytest.raises(ValueError, match="not a msgpack map"):
        InferRequest.decode(msgpack.packb([1, 2, 3]))


# --- batches ----------------------------------------------------------------------------------


def test_batch_round_trips_payloads_in_order() -> None:
    payloads = [
        request_with({"X": Tensor.from_numpy(np.full((1, 2), i, dtype=np.int32))}).encode()
        for i in range(3)
    ]
    payloads.append(b"")

    back = decode_batch(encode_batch(payloads))

    assert back == payloads
    assert [type(p) for p in back] == [bytes] * 4
    decoded = [InferRequest.decode(p) for p in back[:3]]
    assert [int(r.inputs["X"].to_numpy()[0, 0]) for r in decoded] == [0, 1, 2]


def test_empty_batch_round_trips() -> None:
    assert decode_batch(encode_batch([])) == []


def test_decode_batch_rejects_non_list() -> None:
    with pytest.raises(ValueError, match="not a msgpack list"):
        decode_batch(msgpack.packb({"a": 1}))


def test_counting_bytes_elements_agrees_with_deserializing_and_checks_framing() -> None:
    elements = [b"", b"a", b"\x00\xff" * 40, "ünï".encode()] * 50
    raw = datatypes.serialize_bytes(elements)
    assert datatypes.count_bytes_elements(raw) == len(datatypes.deserialize_bytes(raw)) == 200
    assert datatypes.count_bytes_elements(b"") == 0
    with pytest.raises(InvalidInput, match="inside a length prefix"):
        datatypes.count_bytes_elements(raw + b"\x01\x00")
    with pytest.raises(InvalidInput, match="runs past the end"):
        datatypes.count_bytes_elements(raw[:-1])
