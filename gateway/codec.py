"""KServe v2 infer bodies, JSON and Triton's binary tensor data extension, both ways.

A request body is a JSON header, optionally followed by raw tensors in the order their
inputs appear in the JSON (``Inference-Header-Content-Length`` gives the JSON's length, and
each binary input says its ``binary_data_size``). Inputs become :class:`~weir.tensors.Tensor`
objects; nothing downstream sees JSON lists. A response is rendered the same way: outputs
asked for as ``binary_data`` (or all, with ``binary_data_output``) follow the JSON header.

Non-finite floats travel as Triton writes and reads them: the bare tokens ``NaN``,
``Infinity`` and ``-Infinity`` (not standard JSON; Python's ``json`` and tritonclient read
them). Bodies with them take a slower parse (:mod:`gateway.json_text`, which also bounds how
deep ``data`` nests and what a parameter may be); responses with them a slower render.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from gateway import json_bounds, json_text
from gateway.json_bounds import JsonBudget
from gateway.json_data import tensor_from_json
from gateway.shared_memory import SharedMemoryRegistry, TensorRef, input_tensor
from weir import datatypes
from weir.errors import InvalidInput
from weir.tensors import Tensor

MAX_RANK = 64
MAX_ELEMENTS = 2**48


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for: binary or not, and its top-K class count.

    ``classification`` is Triton's classification extension; 0 returns the tensor itself.
    ``shm`` is where in shared memory the output is to be written, when it is.
    """

    name: str
    binary: bool | None = None
    classification: int = 0
    shm: TensorRef | None = None


@dataclass(slots=True)
class InferBody:
    """A parsed infer request body."""

    inputs: dict[str, Tensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    # Every input's name, datatype and shape were checked against the model while parsing.
    prechecked: bool = False
    # The request's batch size, when the parse checked the whole body against the model
    # (gateway.json_plain); 0: gateway.validation.check_request works it out.
    batch: int = 0

    @property
    def binary_output_default(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))

    @property
    def shared_outputs(self) -> dict[str, TensorRef]:
        """The requested outputs to be written to shared memory, by name."""
        return {o.name: o.shm for o in self.outputs if o.shm is not None}


# Checks an input's name, datatype and shape before its data is decoded.
Precheck = Callable[[str, str, tuple[int, ...]], None]


def parse_infer_body(
    body: bytes,
    header_length: int | None,
    precheck: Precheck | None = None,
    shm: SharedMemoryRegistry | None = None,
    model: str = "",
    bounds: JsonBudget | None = None,
) -> InferBody:
    """Parse a JSON or JSON+binary infer body; every problem is an InvalidInput.

    ``precheck`` runs on each input's name, datatype and shape before its data is decoded,
    so a tensor the model would refuse is never built. Tensors in shared memory are found in
    ``shm`` (none is refused without it). JSON past ``bounds`` is refused before it is parsed.
    """
    json_part, binary = _split_body(body, header_length)
    if bounds is not None:
        json_bounds.check(json_part, bounds)
    header = json_text.load_object(json_part)
    raw_inputs = _list_of_objects(header, "inputs")
    if not raw_inputs:
        raise InvalidInput("request has no inputs")
    reader = _BinaryReader(binary)
    shm = _NO_SHARED_MEMORY if shm is None else shm
    # No ``true`` or ``false`` in the text: no element of any input's data is a bool.
    bool_free = b"true" not in json_part and b"false" not in json_part
    inputs: dict[str, Tensor] = {}
    for raw in raw_inputs:
        name, tensor = _parse_input(raw, reader, precheck, shm, model, bool_free)
        if name in inputs:
            raise InvalidInput(f"input '{name}' appears more than once")
        inputs[name] = tensor
    reader.check_consumed()
    return InferBody(
        inputs=inputs,
        outputs=[_parse_output(raw, shm) for raw in _list_of_objects(header, "outputs")],
        parameters=_parameters(header, "request"),
        id=_optional_id(header),
        prechecked=precheck is not None,
    )


def _split_body(body: bytes, header_length: int | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    if header_length <= 0 or header_length > len(body):
        raise InvalidInput(
            f"Inference-Header-Content-Length {header_length} does not fit a body of "
            f"{len(body)} bytes"
        )
    return body[:header_length], body[header_length:]


def _list_of_objects(header: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = header.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidInput(f"'{key}' must be a list of objects")
    return value


def _parameters(raw: dict[str, Any], where: str) -> dict[str, Any]:
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput(f"{where} 'parameters' must be an object")
    for key, value in params.items():
        json_text.check_parameter(where, key, value)
    return params


def check_parameter_size(parameters: dict[str, Any], max_count: int, max_bytes: int) -> None:
    """Refuse request parameters past the gateway's bounds (HTTP and gRPC alike).

    A request's parameters travel in its stream entry, its batch and its worker's memory, so
    their number and size are bounded. The size is the names' and string values' UTF-8 bytes
    (8 for a number or bool): an ASCII string's length costs nothing to read, and a request
    without parameters pays one truth test.
    """
    if not parameters:
        return
    if len(parameters) > max_count:
        raise InvalidInput(
            f"request has {len(parameters)} parameters, more than the {max_count} the gateway "
            "takes (WEIR_GATEWAY_MAX_PARAMETERS)"
        )
    size = sum(_byte_size(key) + _byte_size(value) for key, value in parameters.items())
    if size > max_bytes:
        raise InvalidInput(
            f"request parameters hold {size} bytes, more than the {max_bytes} the gateway "
            "takes (WEIR_GATEWAY_MAX_PARAMETERS_BYTES)"
        )


def _byte_size(value: Any) -> int:
    if isinstance(value, str):
        # Only a non-ASCII string is encoded to be measured; surrogatepass: JSON's lone
        # \ud800 escapes are counted, not raised on.
        return len(value) if value.isascii() else len(value.encode(errors="surrogatepass"))
    return 8  # a number or a bool: KServe's other parameter kinds


def _optional_id(header: dict[str, Any]) -> str | None:
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return request_id


class _BinaryReader:
    """Hands out consecutive slices of the binary part of a body."""

    def __init__(self, binary: bytes) -> None:
        self.binary = binary
        self.offset = 0

    def take(self, name: str, size: int) -> bytes:
        if self.offset + size > len(self.binary):
            raise InvalidInput(
                f"input '{name}': binary_data_size {size} runs past the end of the body "
                f"({len(self.binary) - self.offset} bytes left)"
            )
        chunk = self.binary[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def check_consumed(self) -> None:
        extra = len(self.binary) - self.offset
        if extra:
            raise InvalidInput(f"body has {extra} bytes of binary data that no input claims")


def _parse_input(
    raw: dict[str, Any],
    reader: _BinaryReader,
    precheck: Precheck | None,
    shm: SharedMemoryRegistry,
    model: str,
    bool_free: bool,
) -> tuple[str, Tensor]:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("every input needs a 'name' string")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in datatypes.DATATYPES:
        raise InvalidInput(f"input '{name}': unknown datatype {datatype!r}")
    shape = _shape(name, raw.get("shape"))
    if precheck is not None:
        precheck(name, datatype, shape)
    tensor = _input_tensor(raw, name, datatype, shape, reader, shm, bool_free)
    tensor.check_size(name, model)
    return name, tensor


def _input_tensor(
    raw: dict[str, Any],
    name: str,
    datatype: str,
    shape: tuple[int, ...],
    reader: _BinaryReader,
    shm: SharedMemoryRegistry,
    bool_free: bool,
) -> Tensor:
    parameters = _parameters(raw, f"input '{name}'")
    size = parameters.get("binary_data_size")
    ref = shm.locate(f"input '{name}'", parameters)
    if ref is not None:
        return input_tensor(ref, name, datatype, shape, size is not None or "data" in raw)
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
        return Tensor(datatype, shape, reader.take(name, size))
    if "data" in raw:
        return tensor_from_json(name, datatype, shape, raw["data"], bool_free)
    raise InvalidInput(f"input '{name}' has neither 'data' nor binary_data_size")


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    valid = isinstance(shape, list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    )
    if not valid:
        raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input '{name}': shape has {len(shape)} dims, at most {MAX_RANK}")
    # Bounded before anything is sized from it: no shape can make the gateway allocate.
    count = 1
    for dim in shape:
        count *= dim
        if count > MAX_ELEMENTS:
            raise InvalidInput(f"input '{name}': shape describes more than 2**48 elements")
    return tuple(shape)


def _parse_output(raw: dict[str, Any], shm: SharedMemoryRegistry) -> RequestedOutput:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("every requested output needs a 'name' string")
    parameters = _parameters(raw, f"output '{name}'")
    binary = parameters.get("binary_data")
    count = class_count(name, parameters.get("classification"))
    ref = shared_output(shm, name, parameters, count, bool(binary))
    return RequestedOutput(name, None if binary is None else bool(binary), count, ref)


def shared_output(
    shm: SharedMemoryRegistry, name: str, parameters: dict[str, Any], count: int, binary: bool
) -> TensorRef | None:
    """Where an output is to be written in shared memory, if anywhere; Triton's checks."""
    ref = shm.locate(f"output '{name}'", parameters)
    if ref is not None and count:
        raise InvalidInput("Output can't set both 'shared_memory_region' and 'classification'")
    if ref is not None and binary:
        raise InvalidInput("Output can't set both 'shared_memory_region' and 'binary_data'")
    return ref


def class_count(output: str, value: Any) -> int:
    """An output's ``classification`` parameter: how many top classes, 0 when absent."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(
            f"output '{output}': parameter 'classification' must be a whole number of classes"
        )
    return value


def render_infer_response(
    model: str,
    version: str,
    request_id: str | None,
    outputs: list[tuple[str, Tensor, bool]],
    shared: frozenset[str] = frozenset(),
) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary tensors follow it.

    Outputs named in ``shared`` were written to shared memory: as Triton, they are described
    (name, datatype, shape) without data. orjson writes NaN and infinities as ``null``,
    Triton as ``NaN``, ``Infinity`` and ``-Infinity``: a header with no ``null`` in it has
    none (the common case, one search in C), else it is rendered again, looking into each
    float tensor.
    """
    rendered = _render(model, version, request_id, outputs, shared, check_finite=False)
    if b"null" in rendered[0]:
        rendered = _render(model, version, request_id, outputs, shared, check_finite=True)
    return rendered


def _render(
    model: str,
    version: str,
    request_id: str | None,
    outputs: list[tuple[str, Tensor, bool]],
    shared: frozenset[str],
    check_finite: bool,
) -> tuple[bytes, int | None]:
    rendered: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    non_finite: list[bytes] = []  # JSON text of data orjson would write with nulls
    for name, tensor, binary in outputs:
        item: dict[str, Any] = {
            "name": name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if name in shared:
            pass  # the data lies in the client's region
        elif binary or tensor.datatype == datatypes.BF16:
            item["parameters"] = {"binary_data_size": len(tensor.data)}
            chunks.append(tensor.data)
        else:
            item["data"] = _json_data(tensor, non_finite if check_finite else None)
        rendered.append(item)
    response: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": rendered}
    if request_id is not None:
        response["id"] = request_id
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    for i, text in enumerate(non_finite):
        header = header.replace(orjson.dumps(_placeholder(i)), text, 1)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


def _json_data(tensor: Tensor, non_finite: list[bytes] | None) -> Any:
    """A tensor's data as orjson writes it; with ``non_finite``, NaN and infinities kept."""
    if tensor.datatype == datatypes.BYTES:
        return [e.decode(errors="replace") for e in tensor.to_numpy().reshape(-1)]
    array = np.frombuffer(tensor.data, dtype=datatypes.numpy_dtype(tensor.datatype))
    if non_finite is None or array.dtype.kind != "f":
        return array
    # One sum finds any NaN or infinity (a finite sum can only err towards the slow path).
    if not math.isfinite(np.add.reduce(array, dtype=np.float64)):
        # Spliced in after orjson, which would write null.
        non_finite.append(json.dumps(array.tolist(), separators=(",", ":")).encode())
        return _placeholder(len(non_finite) - 1)
    return array


# A parse without a registry: any region named is unknown.
_NO_SHARED_MEMORY = SharedMemoryRegistry(0, 0)
_PLACEHOLDER = f"\x00weir-non-finite-{secrets.token_hex(8)}-"


def _placeholder(i: int) -> str:
    # Unguessable, so no output name or request id can be mistaken for it.
    return f"{_PLACEHOLDER}{i}"
