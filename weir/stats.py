"""The statistics contract: the stamps a request carries and the counters workers record.

Triton's statistics extension and Weir's metrics are computed from two things every
service shares, named here once:

- :class:`Stamp`: the moments a request's ``ts`` map records (the gateway takes it and
  answers it; a worker starts its batch and ends each compute phase);
- :class:`Field`: the counters of a model's statistics hash (:func:`weir.names.model_stats`),
  which workers increment per batch and the batcher for requests that expired queued, and
  the gateway reads for ``/v2/models/.../stats`` and ``/metrics``.

A :class:`Phase` is a named span between two stamps; Triton's per-request statistics are
``queue`` and the three compute phases.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Stamp:
    """A moment in a request's life, in ``ts`` (unix ns).

    Plain strings, not an enum: ``ts`` comes off the wire with ``str`` keys, and a dict
    lookup that compares a ``str`` key with a ``StrEnum`` goes through the subclass's
    ``__eq__``, four times the cost (~380 against ~95 ns); a request's stamps are looked up
    a dozen times in the gateway and the worker.
    """

    GATEWAY_IN = "gateway_in"
    COMPUTE_START = "compute_start"
    COMPUTE_INPUT_END = "compute_input_end"
    COMPUTE_INFER_END = "compute_infer_end"
    COMPUTE_END = "compute_end"
    GATEWAY_OUT = "gateway_out"


class Phase(NamedTuple):
    """A named span of a request's life, from one stamp to another."""

    name: str
    start: str  # a Stamp
    end: str


QUEUE = Phase("queue", Stamp.GATEWAY_IN, Stamp.COMPUTE_START)
COMPUTE_INPUT = Phase("compute_input", Stamp.COMPUTE_START, Stamp.COMPUTE_INPUT_END)
COMPUTE_INFER = Phase("compute_infer", Stamp.COMPUTE_INPUT_END, Stamp.COMPUTE_INFER_END)
COMPUTE_OUTPUT = Phase("compute_output", Stamp.COMPUTE_INFER_END, Stamp.COMPUTE_END)
REQUEST = Phase("request", Stamp.GATEWAY_IN, Stamp.GATEWAY_OUT)  # the gateway's whole time

COMPUTE_PHASES = (COMPUTE_INPUT, COMPUTE_INFER, COMPUTE_OUTPUT)
# Triton's per-request statistics, which workers sum per model.
REQUEST_PHASES = (QUEUE, *COMPUTE_PHASES)


class Field(StrEnum):
    """A counter of a model's statistics hash."""

    EXECUTION_COUNT = "execution_count"  # backend calls that succeeded
    INFERENCE_COUNT = "inference_count"  # requests in them
    SUCCESS_COUNT = "success_count"
    SUCCESS_NS = "success_ns"
    FAIL_COUNT = "fail_count"
    FAIL_NS = "fail_ns"
    COMPUTE_NS = "compute_ns"  # wall time of the worker's batches
    LAST_INFERENCE = "last_inference"  # unix ms of the last successful backend call
    # The gateways' response caches (gateway.response_cache): lookups that found an answer,
    # and their time; lookups that did not, and the time of the lookup and the keeping.
    CACHE_HIT_COUNT = "cache_hit_count"
    CACHE_HIT_NS = "cache_hit_ns"
    CACHE_MISS_COUNT = "cache_miss_count"
    CACHE_MISS_NS = "cache_miss_ns"


BATCH_SIZE_PREFIX = "batch_size:"


def outcome_fields(succeeded: bool) -> tuple[Field, Field]:
    """The count and ns fields of a request's outcome."""
    if succeeded:
        return Field.SUCCESS_COUNT, Field.SUCCESS_NS
    return Field.FAIL_COUNT, Field.FAIL_NS


def phase_field(phase: Phase) -> str:
    """The field summing ``phase``'s nanoseconds over every request."""
    return f"{phase.name}_ns"


def batch_size_field(batch_size: int) -> str:
    """The field counting executions of one batch size."""
    return f"{BATCH_SIZE_PREFIX}{batch_size}"


def batch_phase_field(phase: Phase, batch_size: int) -> str:
    """The field summing ``phase``'s nanoseconds over executions of one batch size."""
    return f"batch_{phase.name}_ns:{batch_size}"


def batch_sizes(counts: dict[str, int]) -> dict[int, int]:
    """Executions by batch size, from a statistics hash's counters."""
    prefix = len(BATCH_SIZE_PREFIX)
    return {int(k[prefix:]): v for k, v in counts.items() if k.startswith(BATCH_SIZE_PREFIX)}
