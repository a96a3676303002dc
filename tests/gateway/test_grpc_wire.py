"""The wire scan of a ModelInferRequest reads what protobuf would decode, and stops early.

Messages are built with tritonclient's ``service_pb2`` (random ones by hypothesis): the
scan's model, headers, element counts and raw sizes must equal the decoded message's. A
message of millions of elements is refused after a few records, before it is decoded.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from gateway import grpc_wire
from weir.config import ModelConfig
from weir.errors import BodyTooLarge, InvalidInput
from weir.settings import GatewaySettings

HYPOTHESIS = settings(
    max_examples=150,
    deadline=None,
    database=None,  # nothing written into the repository (.hypothesis/)
    suppress_health_check=[HealthCheck.too_slow],
)
CONTENTS = service_pb2.InferTensorContents
NUMERIC = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32, allow_nan=False),
    "fp64_contents": st.floats(allow_nan=False),
}


def model(dims: list[int], data_type: str = "TYPE_STRING", batch: int = 8, **params: str) -> Any:
    return ModelConfig.model_validate(
        {
            "name": "m",
            "backend": "python",
            "max_batch_size": batch,
            "input": [{"name": "TEXT", "data_type": data_type, "dims": dims}],
            "output": [{"name": "Y", "data_type": "TYPE_INT64", "dims": [1]}],
            "parameters": params,
        }
    )


def lookup(config: ModelConfig | None) -> grpc_wire.Lookup:
    return lambda name: config if name == "m" else None


def text_request(count: int, shape: list[int] | None = None) -> Any:
    request = service_pb2.ModelInferRequest(model_name="m", id="r1")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=shape or [1, 1])
    tensor.contents.bytes_contents.extend([b""] * count)
    return request


def test_field_numbers_are_those_of_tritonclients_descriptors() -> None:
    fields = service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name
    assert [fields[n].number for n in ("model_name", "model_version", "id")] == [1, 2, 3]
    assert (fields["inputs"].number, fields["outputs"].number) == (grpc_wire.INPUTS, 6)
    assert fields["raw_input_contents"].number == grpc_wire.RAW_INPUT_CONTENTS
    tensor = service_pb2.ModelInferRequest.InferInputTensor.DESCRIPTOR.fields_by_name
    assert [tensor[n].number for n in ("name", "datatype", "shape", "contents")] == [1, 2, 3, 5]
    contents = CONTENTS.DESCRIPTOR.fields_by_name
    assert contents["bytes_contents"].number == grpc_wire.BYTES_CONTENTS
    numbers = {contents[name].number for name in NUMERIC}
    assert numbers == set(grpc_wire.NUMERIC_CONTENTS)
    fixed = {contents["fp32_contents"].number: 4, contents["fp64_contents"].number: 8}
    assert {n: size for n, (_, size) in grpc_wire.NUMERIC_CONTENTS.items() if size} == fixed


@st.composite
def contents(draw: st.DrawFn) -> Any:
    found = CONTENTS()
    for name in draw(st.lists(st.sampled_from(sorted(NUMERIC)), max_size=3, unique=True)):
        getattr(found, name).extend(draw(st.lists(NUMERIC[name], max_size=40)))
    found.bytes_contents.extend(draw(st.lists(st.binary(max_size=200), max_size=40)))
    return found


@st.composite
def requests(draw: st.DrawFn) -> Any:
    text = st.text(max_size=12)
    request = service_pb2.ModelInferRequest(
        model_name=draw(text), model_version=draw(text), id=draw(text)
    )
    request.parameters["p"].int64_param = draw(st.integers(-5, 5))
    for _ in range(draw(st.integers(0, 4))):
        tensor = request.inputs.add(name=draw(text), datatype=draw(st.sampled_from(["BYTES", ""])))
        tensor.shape.extend(draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=70)))
        tensor.parameters["q"].string_param = draw(text)
        if draw(st.booleans()):
            tensor.contents.CopyFrom(draw(contents()))
    request.outputs.add(name=draw(text))
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=300), max_size=4)))
    return request


def decoded_count(tensor: Any) -> int:
    return sum(len(values) for _, values in tensor.contents.ListFields())


def contents_count(found: Any) -> int:
    return sum(len(values) for _, values in found.ListFields())


@HYPOTHESIS
@given(requests())
def test_the_scan_reads_what_protobuf_decodes(request: Any) -> None:
    wire = request.SerializeToString()
    scanned = grpc_wire.scan_request(wire)
    decoded = service_pb2.ModelInferRequest.FromString(wire)
    head = (decoded.model_name, decoded.model_version, decoded.id)
    assert (scanned.model_name, scanned.model_version, scanned.id) == head
    assert grpc_wire.head(wire) == head
    assert scanned.raw_sizes == [len(raw) for raw in decoded.raw_input_contents]
    assert len(scanned.inputs) == len(decoded.inputs)
    for found, tensor in zip(scanned.inputs, decoded.inputs, strict=True):
        assert (found.name, found.datatype) == (tensor.name, tensor.datatype)
        assert found.rank == len(tensor.shape)
        assert found.dims == list(tensor.shape)[: grpc_wire.MAX_RANK + 1]
        count = grpc_wire.count_elements(wire, found.contents, 10**9)
        assert count == decoded_count(tensor)


@HYPOTHESIS
@given(contents(), st.integers(0, 50))
def test_a_count_stops_just_past_its_limit(found: Any, limit: int) -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="TEXT", contents=found)
    wire = request.SerializeToString()
    (tensor,) = grpc_wire.scan_request(wire).inputs
    count = grpc_wire.count_elements(wire, tensor.contents, limit)
    total = contents_count(found)
    assert count == total if total <= limit else count > limit


def test_unpacked_and_split_contents_are_counted_as_protobuf_merges_them() -> None:
    # fp32 as 3 unpacked records (tag 6<<3|5), bools as 2 (tag 1<<3|0), and a second
    # contents record: protobuf merges a message field met twice.
    first = b"\x35\0\0\x80\x3f" * 3 + b"\x08\x01" * 2
    second = CONTENTS(bytes_contents=[b"a", b""]).SerializeToString()
    tensor = b"\x0a\x04TEXT" + b"\x2a" + bytes([len(first)]) + first
    tensor += b"\x2a" + bytes([len(second)]) + second
    wire = b"\x0a\x01m" + b"\x2a" + bytes([len(tensor)]) + tensor
    (found,) = grpc_wire.scan_request(wire).inputs
    assert grpc_wire.count_elements(wire, found.contents, 100) == 7
    (decoded,) = service_pb2.ModelInferRequest.FromString(wire).inputs
    assert decoded_count(decoded) == 7


def test_millions_of_empty_strings_are_refused_after_a_few_records() -> None:
    wire = text_request(3_000_000).SerializeToString()
    started = time.perf_counter()
    with pytest.raises(InvalidInput) as refused:
        grpc_wire.check_request(wire, lookup(model([1])))
    assert time.perf_counter() - started < 0.05
    assert refused.value.message == (
        "input 'TEXT': shape [1, 1] needs 1 elements, its contents hold more than 1"
    )
    (tensor,) = grpc_wire.scan_request(wire).inputs
    assert grpc_wire.count_elements(wire, tensor.contents, 5) == 6


def test_a_request_within_its_shape_passes_and_an_unknown_model_is_left_to_decoding() -> None:
    wire = text_request(4, [4, 1]).SerializeToString()
    assert grpc_wire.check_request(wire, lookup(model([1]))).model_name == "m"
    huge = text_request(100_000).SerializeToString()
    assert grpc_wire.check_request(huge, lookup(None)).inputs[0].name == "TEXT"


def test_a_header_is_refused_as_decoding_would_refuse_it() -> None:
    config = lookup(model([1]))
    wrong_shape = text_request(1, [1, 2]).SerializeToString()
    with pytest.raises(InvalidInput, match=r"unexpected shape for input 'TEXT'"):
        grpc_wire.check_request(wrong_shape, config)
    request = text_request(2)
    request.inputs[0].name = "OTHER"
    with pytest.raises(InvalidInput, match=r"unexpected input 'OTHER' for model 'm'"):
        grpc_wire.check_request(request.SerializeToString(), config)
    deep = text_request(0, [1] * 1000).SerializeToString()
    with pytest.raises(InvalidInput, match=r"shape has 1000 dims, at most 64"):
        grpc_wire.check_request(deep, config)


def test_a_variable_shape_is_bounded_by_max_input_bytes() -> None:
    bounded = lookup(model([-1], max_input_bytes="400"))
    request = text_request(200_000, [1, 101])  # 101 strings take 404 bytes at least
    with pytest.raises(BodyTooLarge, match=r"holds 404 bytes at least, over the max_input_bytes"):
        grpc_wire.check_request(request.SerializeToString(), bounded)
    within = text_request(200_000, [1, 100]).SerializeToString()
    with pytest.raises(InvalidInput, match=r"needs 100 elements, its contents hold more than 100"):
        grpc_wire.check_request(within, bounded)


def test_more_raw_entries_than_inputs_are_refused_with_the_decoders_words() -> None:
    request = text_request(0)
    request.raw_input_contents.extend([b""] * 3)
    with pytest.raises(InvalidInput, match=r"^request has 3 raw_input_contents for 1 inputs"):
        grpc_wire.check_request(request.SerializeToString(), lookup(None))


def test_records_past_the_limit_are_refused_however_they_are_ordered() -> None:
    request = service_pb2.ModelInferRequest()
    request.raw_input_contents.extend([b""] * (grpc_wire.MAX_RECORDS + 1))
    # The model's name last: the scan cannot know its model before it ends.
    wire = request.SerializeToString() + b"\x0a\x01m"
    with pytest.raises(InvalidInput, match=r"more than 65536 inputs, outputs, parameters"):
        grpc_wire.check_request(wire, lookup(model([1])))


@pytest.mark.parametrize(
    "wire",
    [b"\x0a\x05ab", b"\x0a", b"\x0b\x0c", b"\x2a\x03\x2a\x05\x00", b"\x08" + b"\xff" * 11],
    ids=["short-string", "no-length", "group", "input-past-its-end", "long-varint"],
)
def test_a_broken_message_is_an_invalid_argument(wire: bytes) -> None:
    with pytest.raises(InvalidInput, match=r"not a valid ModelInferRequest \(broken at byte"):
        grpc_wire.scan_request(wire)
    with pytest.raises(InvalidInput, match=r"^the request is not a valid ModelInferRequest"):
        grpc_wire.decode(wire + b"\x0a")


def test_a_small_message_is_decoded_at_once_and_a_large_one_is_checked_first() -> None:
    gateway = GatewaySettings(parse_inline_bytes=1024)
    small = text_request(100).SerializeToString()
    decoded = asyncio.run(grpc_wire.decode_request(gateway, small, lookup(model([1]))))
    assert len(decoded.inputs[0].contents.bytes_contents) == 100  # not checked: left to parse
    large = text_request(1000).SerializeToString()
    with pytest.raises(InvalidInput, match=r"its contents hold more than 1"):
        asyncio.run(grpc_wire.decode_request(gateway, large, lookup(model([1]))))
