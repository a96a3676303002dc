"""KServe v2 gRPC infer messages, to Weir's parsed requests and back.

A ``ModelInferRequest`` becomes the same :class:`~gateway.codec.InferBody` an HTTP body
does, so validation and everything after it are shared. Inputs arrive either all in
``raw_input_contents`` (row-major little-endian bytes, ``BYTES`` length-prefixed: exactly
Weir's tensor data, as ``tritonclient`` sends them) or each in its typed ``contents`` field.
Outputs go back as Triton's server sends them: every tensor in ``raw_output_contents``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from gateway.codec import MAX_ELEMENTS, MAX_RANK, InferBody, Precheck, RequestedOutput
from weir import datatypes
from weir.errors import InvalidInput
from weir.tensors import Tensor

# Triton's typed contents: the field that carries each datatype and the dtype it holds.
# FP16 and BF16 have none; they travel in raw_input_contents only.
CONTENTS_FIELDS: dict[str, tuple[str, np.dtype[Any]]] = {
    "BOOL": ("bool_contents", np.dtype("?")),
    **{t: ("int_contents", np.dtype("<i4")) for t in ("INT8", "INT16", "INT32")},
    "INT64": ("int64_contents", np.dtype("<i8")),
    **{t: ("uint_contents", np.dtype("<u4")) for t in ("UINT8", "UINT16", "UINT32")},
    "UINT64": ("uint64_contents", np.dtype("<u8")),
    "FP32": ("fp32_contents", np.dtype("<f4")),
    "FP64": ("fp64_contents", np.dtype("<f8")),
}
BYTES_FIELD = "bytes_contents"
# Parameters that ask for Triton's shared-memory extension, which Weir does not implement.
SHARED_MEMORY_PREFIX = "shared_memory_"


def parse_infer_request(request: Any, precheck: Precheck | None = None) -> InferBody:
    """An InferBody from a ``ModelInferRequest``; every problem is an InvalidInput.

    ``precheck`` runs on each input's name, datatype and shape before its data is decoded.
    """
    if not request.inputs:
        raise InvalidInput("request has no inputs")
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(
            f"request has {len(raw)} raw_input_contents for {len(request.inputs)} inputs; "
            "raw_input_contents needs one entry per input, in order"
        )
    inputs: dict[str, Tensor] = {}
    for index, tensor in enumerate(request.inputs):
        name, parsed = _parse_input(tensor, raw[index] if raw else None, precheck)
        if name in inputs:
            raise InvalidInput(f"input '{name}' appears more than once")
        inputs[name] = parsed
    return InferBody(
        inputs=inputs,
        outputs=[_parse_output(output) for output in request.outputs],
        parameters=_parameters(request.parameters, "request"),
        id=request.id or None,
    )


def _parse_input(tensor: Any, raw: bytes | None, precheck: Precheck | None) -> tuple[str, Tensor]:
    name = tensor.name
    if not name:
        raise InvalidInput("every input needs a name")
    datatype = tensor.datatype
    if datatype not in datatypes.DATATYPES:
        raise InvalidInput(f"input '{name}': unknown datatype {datatype!r}")
    shape = _shape(name, tensor.shape)
    _parameters(tensor.parameters, f"input '{name}'")
    if precheck is not None:
        precheck(name, datatype, shape)
    if raw is None:
        data = _from_contents(name, datatype, shape, tensor.contents)
    elif tensor.HasField("contents"):
        raise InvalidInput(f"input '{name}' has both contents and raw_input_contents")
    else:
        data = raw
    parsed = Tensor(datatype, shape, data)
    try:
        parsed.check_size()
    except InvalidInput as exc:
        raise InvalidInput(f"input '{name}': {exc.message}") from None
    return name, parsed


def _shape(name: str, dims: Iterable[int]) -> tuple[int, ...]:
    shape = tuple(dims)
    if any(dim < 0 for dim in shape):
        raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input '{name}': shape has {len(shape)} dims, at most {MAX_RANK}")
    if math.prod(shape) > MAX_ELEMENTS:
        raise InvalidInput(f"input '{name}': shape describes more than 2**48 elements")
    return shape


def _from_contents(name: str, datatype: str, shape: tuple[int, ...], contents: Any) -> bytes:
    """Tensor data from a typed ``contents`` field, checked to fit ``datatype``."""
    if datatype == datatypes.BYTES:
        elements = list(contents.bytes_contents)
        _check_count(name, shape, BYTES_FIELD, len(elements))
        return datatypes.serialize_bytes(elements)
    if datatype not in CONTENTS_FIELDS:
        raise InvalidInput(f"input '{name}': {datatype} data must be sent in raw_input_contents")
    field, held = CONTENTS_FIELDS[datatype]
    values = getattr(contents, field)
    _check_count(name, shape, field, len(values))
    array = np.array(values, dtype=held)
    wanted = datatypes.numpy_dtype(datatype)
    converted = array.astype(wanted)
    if wanted != held and not np.array_equal(converted, array):
        raise InvalidInput(f"input '{name}': {field} holds values that do not fit {datatype}")
    return converted.tobytes()


def _check_count(name: str, shape: tuple[int, ...], field: str, found: int) -> None:
    if found != math.prod(shape):
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {math.prod(shape)} elements, "
            f"{field} has {found}"
        )


def _parse_output(output: Any) -> RequestedOutput:
    if not output.name:
        raise InvalidInput("every requested output needs a name")
    _parameters(output.parameters, f"output '{output.name}'")
    return RequestedOutput(output.name)


def _parameters(parameters: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Plain values of a map of ``InferParameter``; shared memory is refused."""
    plain: dict[str, Any] = {}
    for key, parameter in parameters.items():
        if key.startswith(SHARED_MEMORY_PREFIX):
            raise InvalidInput(
                f"{where}: parameter '{key}': Weir does not implement the shared-memory "
                "extension; send tensor data in the request"
            )
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidInput(f"{where}: parameter '{key}' has no value")
        plain[key] = getattr(parameter, choice)
    return plain


def render_infer_response(
    model: str, version: str, request_id: str, outputs: list[tuple[str, Tensor]]
) -> Any:
    """A ``ModelInferResponse`` with every output's data in ``raw_output_contents``."""
    response = service_pb2.ModelInferResponse(
        model_name=model, model_version=version, id=request_id
    )
    for name, tensor in outputs:
        response.outputs.add(name=name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(tensor.data)
    return response


def select_outputs(body: InferBody, outputs: dict[str, Tensor]) -> list[tuple[str, Tensor]]:
    """The outputs the request asked for, in its order; all of them when it named none."""
    if not body.outputs:
        return list(outputs.items())
    return [(requested.name, outputs[requested.name]) for requested in body.outputs]
