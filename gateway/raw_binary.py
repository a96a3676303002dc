"""Triton's raw binary request: ``Inference-Header-Content-Length: 0`` and no JSON at all.

The whole body is the data of the model's one input; its name, datatype and shape come from
the model's config, as Triton deduces them: a batch of one when the model batches
(``max_batch_size`` > 0), then the config's dims, with at most one variable dim (-1) sized
from the body's length. A BYTES input holds one element, the body itself (the model's dims
must make one element, e.g. ``[1]``); its length prefix is added here, as Triton adds it. A
model with more than one input, or with two variable dims, is refused. Every output is
answered, as binary data.
"""

from __future__ import annotations

import math

from gateway.codec import InferBody
from weir import datatypes
from weir.config import ModelConfig, TensorSpec
from weir.errors import InvalidInput
from weir.tensors import Tensor


def parse_raw_body(config: ModelConfig, body: bytes) -> InferBody:
    """The one-input request a raw body makes for ``config``; InvalidInput if it cannot."""
    spec = _only_input(config)
    shape = _deduced_shape(config, spec, len(body))
    data = datatypes.serialize_bytes([body]) if spec.datatype == datatypes.BYTES else body
    tensor = Tensor(spec.datatype, shape, data)
    tensor.check_size(spec.name, config.name)
    return InferBody(inputs={spec.name: tensor}, parameters={"binary_data_output": True})


def _only_input(config: ModelConfig) -> TensorSpec:
    if len(config.input) != 1:
        raise InvalidInput(  # Triton's words
            f"Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(config.input)} inputs in '{config.name}' model configuration"
        )
    return config.input[0]


def _deduced_shape(config: ModelConfig, spec: TensorSpec, byte_size: int) -> tuple[int, ...]:
    variable = [axis for axis, dim in enumerate(spec.dims) if dim == -1]
    if len(variable) > 1:
        raise InvalidInput(
            f"The shape of the raw input '{spec.name}' can not be deduced because there are "
            "more than one variable-sized dimension"
        )
    dims = list(spec.dims)
    fixed_count = math.prod(d for d in dims if d != -1)
    if spec.datatype == datatypes.BYTES:
        if variable or fixed_count != 1:
            raise InvalidInput(
                f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]"
            )
    elif variable:
        element_size = datatypes.element_size(spec.datatype) or 1
        dims[variable[0]] = byte_size // fixed_count // element_size
    batch = [1] if config.max_batch_size > 0 else []
    return (*batch, *dims)
