"""Checks a parsed request against the model's config before anything is queued.

Each problem is a 400 that names the tensor and what is wrong with it: an unknown or
missing input, a wrong datatype, a wrong rank or dimension, a batch over
``max_batch_size``, inputs that disagree on the batch size, an unknown output. Inputs over
the model's ``max_input_bytes`` parameter are a 413.
"""

from __future__ import annotations

from typing import Any

from gateway.codec import InferBody
from weir import wire
from weir.config import ModelConfig, TensorSpec
from weir.config_sequence import ControlKind
from weir.errors import BodyTooLarge, InvalidInput
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.wire import InferRequest


def check_request(config: ModelConfig, body: InferBody) -> int:
    """Validate ``body`` for ``config``; returns the request's batch size (1 if unbatched)."""
    if body.batch:  # parsed as a plain body (gateway.json_plain), which checked all of this
        return body.batch
    _check_names(config, body)
    if body.prechecked:  # each tensor passed _check_tensor as it was parsed
        batched = config.max_batch_size > 0
        batch_sizes = {t.shape[0] if batched else 1 for t in body.inputs.values()}
    else:
        batch_sizes = {
            _check_tensor(config, spec, body.inputs[spec.name])
            for spec in config.input
            if spec.name in body.inputs
        }
    if len(batch_sizes) > 1:
        sizes = ", ".join(str(s) for s in sorted(batch_sizes))
        raise InvalidInput(f"inputs of model '{config.name}' disagree on the batch size ({sizes})")
    _check_input_bytes(config, body)
    return batch_sizes.pop() if batch_sizes else 1


def _check_input_bytes(config: ModelConfig, body: InferBody) -> None:
    limit = config.max_input_bytes
    size = sum(len(tensor.data) for tensor in body.inputs.values()) if limit else 0
    if limit and size > limit:
        raise BodyTooLarge(
            f"the inputs of model '{config.name}' hold {size} bytes, over its "
            f"max_input_bytes parameter ({limit})"
        )


def precheck_input(config: ModelConfig, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """Refuse an input by its header alone (name, datatype, shape), before its data."""
    spec = config.input_spec(name)
    if spec is None:
        raise _unexpected_input(config, name)
    _check_tensor(config, spec, Tensor(datatype, shape, b""))


def _unexpected_input(config: ModelConfig, name: str) -> InvalidInput:
    expected = ", ".join(sorted(spec.name for spec in config.input))
    return InvalidInput(f"unexpected input '{name}' for model '{config.name}'; expected {expected}")


def _check_names(config: ModelConfig, body: InferBody) -> None:
    for name in body.inputs:
        if config.input_spec(name) is None:
            raise _unexpected_input(config, name)
    for spec in config.input:
        if spec.name not in body.inputs and not spec.optional:
            raise InvalidInput(f"missing input '{spec.name}' for model '{config.name}'")
    seen: set[str] = set()
    for requested in body.outputs:
        if requested.name in seen:
            raise InvalidInput(f"output '{requested.name}' is requested more than once")
        seen.add(requested.name)
    if config.is_ensemble:
        return  # a pipeline request may name any of its tensors; its plan checks them
    outputs = {spec.name for spec in config.output}
    for requested in body.outputs:
        if requested.name not in outputs:
            raise InvalidInput(
                f"unknown output '{requested.name}' for model '{config.name}'; "
                f"expected {', '.join(sorted(outputs))}"
            )


def _dims(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"  # as Triton prints a shape


def _check_tensor(config: ModelConfig, spec: TensorSpec, tensor: Tensor) -> int:
    if tensor.datatype != spec.datatype:
        raise InvalidInput(
            f"input '{spec.name}' has datatype {tensor.datatype}, "
            f"model '{config.name}' expects {spec.datatype}"
        )
    expected = config.full_shape(spec)
    shape = list(tensor.shape)
    if len(shape) != len(expected) or any(
        want != -1 and got != want for got, want in zip(shape, expected, strict=True)
    ):
        raise InvalidInput(  # Triton's words, which its clients' tests match on
            f"unexpected shape for input '{spec.name}' for model '{config.name}'. "
            f"Expected {_dims(expected)}, got {_dims(shape)}"
        )
    if config.max_batch_size == 0:
        return 1
    batch = shape[0]
    if batch < 1 or batch > config.max_batch_size:
        raise InvalidInput(
            f"input '{spec.name}' has batch size {batch}; model '{config.name}' takes "
            f"1 to {config.max_batch_size} (max_batch_size)"
        )
    return batch


def request_timeout_s(server_s: float, config: ModelConfig, body: InferBody, level: int) -> float:
    """The request's deadline: the server's, lowered by its queue policy and its ``timeout``.

    The model's ``default_timeout_microseconds`` (its priority level's policy) lowers it when
    the policy rejects; a policy that delays lets the request wait on (:func:`queue_fields`).
    The request's ``timeout`` parameter (microseconds) may lower it too; 0 sets none.
    """
    timeout_s = server_s
    batching = config.dynamic_batching
    policy = batching.policy(level) if batching else None
    if policy is not None and policy.default_timeout_microseconds and not policy.delays:
        timeout_s = min(timeout_s, policy.default_timeout_microseconds / 1e6)
    override = body.parameters.get("timeout")
    if override is not None:
        if not isinstance(override, int) or isinstance(override, bool) or override < 0:
            raise InvalidInput(
                "parameter 'timeout' must be a whole number of microseconds, 0 for none"
            )
        if override:  # 0: no timeout of the request's own, as Triton reads it
            timeout_s = min(timeout_s, override / 1e6)
    return timeout_s


def queue_fields(
    config: ModelConfig,
    request: InferRequest,
    level: int,
    fields: dict[bytes, bytes],
    readmit: bool,
) -> int:
    """Add what the batcher needs of the level's queue policy; returns the level's own bound.

    A policy that delays: when the request moves behind the others (unix ms). A level with a
    policy of its own in ``priority_queue_policy`` and a ``max_queue_size``: that bound, and
    the request marked as counted in its level (0: not; a request queued again never is).
    """
    batching = config.dynamic_batching
    if batching is None:
        return 0
    policy = batching.policy(level)
    if policy.delays:
        taken_ms = request.ts.get(Stamp.GATEWAY_IN, wire.now_ns()) // 1_000_000
        fields[wire.DELAY_AT] = b"%d" % (taken_ms + policy.default_timeout_microseconds // 1000)
    own = batching.priority_queue_policy.get(level + 1)
    if own is None or not own.max_queue_size or readmit:
        return 0
    fields[wire.LEVEL_COUNTED] = b"1"
    return own.max_queue_size


def priority_level(config: ModelConfig, body: InferBody) -> int:
    """The batcher queue level for the request's ``priority`` parameter (Triton's rule)."""
    priority = body.parameters.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
        raise InvalidInput("parameter 'priority' must be a non-negative integer")
    batching = config.dynamic_batching
    if batching is None or not batching.priority_levels:
        return 0
    if priority > batching.priority_levels:
        raise InvalidInput(
            f"parameter 'priority' {priority} exceeds priority_levels "
            f"{batching.priority_levels} of model '{config.name}'"
        )
    return batching.level_index(priority)


# Request parameters the server acts on (Triton's reserved names and the gateway's own).
SERVER_PARAMETERS = frozenset(
    (
        "timeout",
        "priority",
        "binary_data_output",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "headers",
        "triton_enable_empty_final_response",
    )
)


def model_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """A request's parameters for its model: all but those the server acts on."""
    return {k: v for k, v in parameters.items() if k not in SERVER_PARAMETERS}


def sequence_of(config: ModelConfig, body: InferBody, batch: int) -> tuple[int | str, int] | None:
    """A sequence model's request: its ``sequence_id`` and its START and END flags.

    Triton's parameters and words. Other models ignore them, as Triton's other schedulers do.
    """
    if config.sequence_batching is None:
        return None
    parameters = body.parameters
    sequence_id = parameters.get("sequence_id", 0)
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, int | str):
        raise InvalidInput("parameter 'sequence_id' must be an unsigned integer or a string")
    if isinstance(sequence_id, int) and not 0 <= sequence_id < 2**64:
        raise InvalidInput("parameter 'sequence_id' must be an unsigned 64-bit integer")
    if not sequence_id:
        raise InvalidInput(
            f"inference request to model '{config.name}' must specify a non-zero or "
            "non-empty correlation ID"
        )
    if batch != 1:
        raise InvalidInput(
            f"inference request to model '{config.name}' must specify batch-size 1 due to "
            "requirements of sequence batcher"
        )
    _check_corrid(config, sequence_id)
    flags = 0
    for name, flag in (
        ("sequence_start", wire.SEQUENCE_START),
        ("sequence_end", wire.SEQUENCE_END),
    ):
        value = parameters.get(name, False)
        if not isinstance(value, bool):
            raise InvalidInput(f"parameter '{name}' must be a boolean")
        flags |= flag if value else 0
    return sequence_id, flags


# The sequence ids each integer CORRID control datatype holds.
_CORRID_BOUNDS = {
    "UINT64": (0, 2**64),
    "INT64": (0, 2**63),
    "UINT32": (0, 2**32),
    "INT32": (0, 2**31),
}


def _check_corrid(config: ModelConfig, sequence_id: int | str) -> None:
    """The id must fit the model's CONTROL_SEQUENCE_CORRID input, when it has one."""
    sequencing = config.sequence_batching
    corrids = sequencing.control(ControlKind.CORRID) if sequencing else []
    for name, control in corrids:
        bounds = _CORRID_BOUNDS.get(control.datatype)
        if bounds is None:
            continue  # TYPE_STRING takes any id, as its text
        if isinstance(sequence_id, str) or not bounds[0] <= sequence_id < bounds[1]:
            raise InvalidInput(
                f"sequence id {sequence_id!r} does not fit input '{name}' "
                f"({control.datatype}, CONTROL_SEQUENCE_CORRID) of model '{config.name}'"
            )
