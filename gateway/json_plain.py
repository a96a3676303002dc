"""The plain JSON infer body parsed and checked in one pass: the common request, cheaply.

Most requests to a model of float inputs are one shape: ``{"inputs": [{"name", "shape",
"datatype", "data"}, ...]}`` (an ``id`` at most), every input of the model once, each with
its flat list of numbers. The general parse (:func:`gateway.codec.parse_infer_body`, then
:func:`gateway.validation.check_request`) reads such a body through some hundred small
calls, a fifth of the gateway's CPU per request on a small model. :func:`parse` reads it in
one: it accepts only a body it can check completely against the model's config (names,
datatypes, shapes, the batch size, the element count) and returns None for anything else
(other keys, parameters, requested outputs, binary or shared-memory data, nested or bool
data, any mistake), which then takes the general path and gets its error from there. What
it accepts, the general path would accept too, as the same tensors and batch size.
"""

from __future__ import annotations

import functools
import math
import weakref
from dataclasses import dataclass

import orjson

from gateway.codec import InferBody
from gateway.json_data import flat_floats
from weir.config import ModelConfig
from weir.tensors import Tensor

_FLOATS = frozenset(("FP16", "FP32", "FP64"))
_INPUT_KEYS = frozenset(("name", "shape", "datatype", "data"))


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a model's plain bodies must hold: each input's datatype and dims, by name."""

    inputs: dict[str, tuple[str, tuple[int, ...]]]
    max_batch_size: int  # 0: the model does not batch


def parse(raw: bytes, config: ModelConfig) -> InferBody | None:
    """The body, its batch size set, when it is a plain body ``config`` takes; else None.

    InvalidInput only where the general path raises the same (a number past the datatype's
    range).
    """
    plan = _plan_of(config)
    if plan is None or b"true" in raw or b"false" in raw:
        return None  # a bool among the numbers: the general path refuses it by name
    try:
        header = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(header) is not dict:
        return None
    raw_inputs = header.get("inputs")
    request_id = header.get("id")
    if (
        len(header) != 1 + ("id" in header)
        or type(raw_inputs) is not list
        or len(raw_inputs) != len(plan.inputs)
        or (request_id is not None and type(request_id) is not str)
    ):
        return None
    inputs: dict[str, Tensor] = {}
    batch = 0
    for item in raw_inputs:
        parsed = _input(item, plan)
        if parsed is None or parsed[0] in inputs or batch not in (0, parsed[2]):
            return None
        name, inputs[name], batch = parsed
    return InferBody(inputs=inputs, id=request_id, prechecked=True, batch=batch)


def _input(item: object, plan: _Plan) -> tuple[str, Tensor, int] | None:
    """One input and its batch size, when plain and as the model wants it; else None."""
    if type(item) is not dict or item.keys() != _INPUT_KEYS:
        return None
    name = item["name"]
    wanted = plan.inputs.get(name) if type(name) is str else None
    if wanted is None or item["datatype"] != wanted[0]:
        return None
    shape, data = item["shape"], item["data"]
    if type(shape) is not list or type(data) is not list:
        return None
    batch = _batch_of(shape, wanted[1], plan.max_batch_size)
    if batch is None or len(data) != math.prod(shape):
        return None
    floats = flat_floats(name, wanted[0], data)
    if floats is None:
        return None
    return name, Tensor(wanted[0], tuple(shape), floats), batch


def _batch_of(shape: list[object], dims: tuple[int, ...], max_batch_size: int) -> int | None:
    """The batch size ``shape`` gives, when it fits ``dims``; else None."""
    if max_batch_size:
        if len(shape) != len(dims) + 1:
            return None
        batch = shape[0]
        if type(batch) is not int or not 1 <= batch <= max_batch_size:
            return None
        rest = shape[1:]
    else:
        batch, rest = 1, shape
    if len(rest) != len(dims):
        return None
    for got, want in zip(rest, dims, strict=True):
        if type(got) is not int or got < 0 or (want != -1 and got != want):
            return None
    return batch


# Each config's plan, for as long as the config lives (a model loaded again gets a new one).
_PLANS: dict[int, tuple[weakref.ref[ModelConfig], _Plan | None]] = {}


def _plan_of(config: ModelConfig) -> _Plan | None:
    key = id(config)
    cached = _PLANS.get(key)
    if cached is not None and cached[0]() is config:
        return cached[1]
    plan = _plan(config)
    _PLANS[key] = (weakref.ref(config, functools.partial(_forget, key)), plan)
    return plan


def _forget(key: int, _: weakref.ref[ModelConfig]) -> None:
    _PLANS.pop(key, None)


def _plan(config: ModelConfig) -> _Plan | None:
    """The model's plan, or None when its bodies always take the general path.

    Only models whose inputs are all required float tensors, with no byte limit of their own
    and no pipeline, have plain bodies.
    """
    if config.is_ensemble or config.max_input_bytes or not config.input:
        return None
    if any(spec.optional or spec.datatype not in _FLOATS for spec in config.input):
        return None
    inputs = {spec.name: (spec.datatype, tuple(spec.dims)) for spec in config.input}
    return _Plan(inputs, config.max_batch_size)
