"""Running one batch: concatenate the members' inputs, run the backend, split the outputs.

Members whose non-batch dimensions differ cannot share one tensor, so a batch runs as one
backend call per run of members with equal shapes. Every call must return one output row
per input row.

A call that fails is run again in halves, so that one bad request (a token past the
vocabulary, say) fails alone and the valid requests batched with it are answered; each
half that fails is split again, up to ``isolation_runs`` extra calls per batch
(``WEIR_WORKER_ISOLATION_RUNS``), after which what is still failing fails with its error.
A failure's message names the model and the runtime's last line, never its traceback or
serialized code, which go to the worker's log.

While a call runs, the backend may ask whether anyone still waits for it
(:mod:`workers.batch_wait`); a group nobody waits for any more is not run (nor run again in
halves), and a handler that gives up raises DeadlineExceeded, which is not split either.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby

import numpy as np

from weir import datatypes
from weir.config import ModelConfig
from weir.errors import DeadlineExceeded, ServerError, WeirError
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest, now_ns
from workers.backends.base import ModelBackend
from workers.batch_wait import BatchWait, PartSink, never, running
from workers.ragged import Ragged

logger = logging.getLogger(__name__)

ISOLATION_RUNS = 16
MESSAGE_CHARS = 300  # of a runtime's message, in a failed request's reply


@dataclass(frozen=True, slots=True)
class Execution:
    """One backend call: its batch size, and its phases' nanoseconds when it succeeded.

    ``phases_ns`` holds compute_input, compute_infer and compute_output, as Triton splits a
    model execution; None for a call that failed.
    """

    batch_size: int
    phases_ns: tuple[int, int, int] | None


class BatchRunner:
    """Runs batches of one model on one backend instance."""

    def __init__(
        self, config: ModelConfig, backend: ModelBackend, isolation_runs: int = ISOLATION_RUNS
    ) -> None:
        self.config = config
        self.backend = backend
        self.batches = config.max_batch_size > 0
        self.isolation_runs = isolation_runs
        self.is_canceled: Callable[[str], bool] = never  # the batch being run's
        self.part_sink: PartSink | None = None  # where a streaming backend's parts go
        self.ragged = Ragged(config)

    def run(self, requests: list[InferRequest]) -> tuple[list[InferReply], list[int]]:
        """One reply per request, in order, and the batch size of each backend call made.

        Called in an executor thread.
        """
        replies, executions = self.run_batch(requests)
        return replies, [execution.batch_size for execution in executions]

    def run_batch(
        self, requests: list[InferRequest], is_canceled: Callable[[str], bool] | None = None
    ) -> tuple[list[InferReply], list[Execution]]:
        """One reply per request, in order, and each backend call made, timed.

        Called in an executor thread. ``is_canceled``: whether a request's client left.
        """
        self.is_canceled = is_canceled or never
        replies: list[InferReply] = []
        executions: list[Execution] = []
        budget = [self.isolation_runs]  # extra calls left to find failing members
        for _, group in groupby(requests, key=self._shape_key):
            group_replies, group_executions = self._run_group(list(group), budget)
            replies.extend(group_replies)
            executions.extend(group_executions)
        return replies, executions

    def _shape_key(self, request: InferRequest) -> tuple[tuple[int, ...] | None, ...]:
        # Members batch together only when they carry the same inputs with the same shapes.
        skip = 1 if self.batches else 0
        return tuple(
            request.inputs[spec.name].shape[skip:]
            if spec.name in request.inputs and spec.name not in self.ragged.shape_free
            else None
            for spec in self.config.input
        )

    def _run_group(
        self, members: list[InferRequest], budget: list[int]
    ) -> tuple[list[InferReply], list[Execution]]:
        if BatchWait(members, self.is_canceled).is_cancelled():  # nobody waits any more
            gone = DeadlineExceeded(DeadlineExceeded.TRITON_TEXT)
            return [InferReply.failure(r, gone) for r in members], []
        rows = sum(self._rows(r) for r in members)
        try:
            replies, phases_ns = self._execute(members)
            return replies, [Execution(rows, phases_ns)]
        except Exception as exc:
            error = self._error(exc, len(members), first=budget[0] == self.isolation_runs)
        failed = Execution(rows, None)
        if len(members) == 1 or budget[0] < 2 or isinstance(error, DeadlineExceeded):
            return [InferReply.failure(r, error) for r in members], [failed]
        budget[0] -= 2
        half = len(members) // 2
        left, left_runs = self._run_group(members[:half], budget)
        right, right_runs = self._run_group(members[half:], budget)
        return left + right, [failed, *left_runs, *right_runs]

    def _error(self, exc: Exception, members: int, first: bool) -> WeirError:
        if isinstance(exc, WeirError):
            return exc
        if first:  # the whole story once per batch, in the log only
            logger.error(
                "model %s failed on a batch of %d", self.config.name, members, exc_info=exc
            )
        return ServerError(
            f"model '{self.config.name}' failed: {type(exc).__name__}: {short_message(exc)}"
        )

    def _execute(
        self, members: list[InferRequest]
    ) -> tuple[list[InferReply], tuple[int, int, int]]:
        started = now_ns()
        sizes = [self._rows(r) for r in members]
        present = [spec.name for spec in self.config.input if spec.name in members[0].inputs]
        inputs = {name: self._gather(name, members) for name in present}
        if self.ragged.batch_inputs:
            inputs.update(self.ragged.computed(members))
        computed = now_ns()
        with running(members, self.is_canceled, self.part_sink, sizes if self.batches else ()):
            outputs = self.backend.infer(inputs)
        inferred = now_ns()
        replies = self._replies(members, outputs, sizes)
        done = now_ns()
        stamps: dict[str, int] = {
            Stamp.COMPUTE_START: started,
            Stamp.COMPUTE_INPUT_END: computed,
            Stamp.COMPUTE_INFER_END: inferred,
            Stamp.COMPUTE_END: done,
        }
        for reply in replies:
            reply.ts.update(stamps)
        return replies, (computed - started, inferred - computed, done - inferred)

    def _rows(self, request: InferRequest) -> int:
        if not self.batches:
            return 1
        return next(iter(request.inputs.values())).shape[0]

    def _gather(self, name: str, members: list[InferRequest]) -> np.ndarray:
        if name in self.ragged.flat:
            return self.ragged.gather(name, members)
        arrays = [r.inputs[name].to_numpy() for r in members]
        if not self.batches:
            return arrays[0].copy()
        # concatenate copies, so the backend gets a writable array it may hand to torch.
        return np.concatenate(arrays, axis=0)

    def _replies(
        self, members: list[InferRequest], outputs: dict[str, np.ndarray], sizes: list[int]
    ) -> list[InferReply]:
        """Each member's reply: its rows of each output it asked for (all, when none).

        A decoupled model that sent every response as a part returns no outputs at all:
        each reply then only ends its request's stream.
        """
        if not outputs and self.config.decoupled:
            return [InferReply(r.id, r.model, r.version, {}, ts=dict(r.ts)) for r in members]
        self._check_rows(outputs, sizes)
        every = [spec.name for spec in self.config.output]
        wanted = [r.outputs or every for r in members]
        parts = {name: self._parts(name, outputs[name], sizes, members) for name in dict.fromkeys(
            name for names in wanted for name in names
        )}  # fmt: skip
        return [
            InferReply(r.id, r.model, r.version, {n: parts[n][i] for n in names}, ts=dict(r.ts))
            for i, (r, names) in enumerate(zip(members, wanted, strict=True))
        ]

    def _check_rows(self, outputs: dict[str, np.ndarray], sizes: list[int]) -> None:
        if not self.batches:
            return
        total = sum(sizes)
        for name, array in outputs.items():
            if name in self.ragged.scattered:  # cut by its source input's elements instead
                continue
            if array.ndim == 0 or array.shape[0] != total:
                raise ServerError(
                    f"model '{self.config.name}' returned {name} with shape {list(array.shape)} "
                    f"for a batch of {total}: one output row per input row is required"
                )

    def _parts(
        self, name: str, array: np.ndarray, sizes: list[int], members: list[InferRequest]
    ) -> list[Tensor]:
        """One output as a tensor per member, its datatype checked once for the batch.

        Its bytes are made once and sliced by rows.
        """
        spec = self.config.output_spec(name)
        if spec is None:
            raise ServerError(f"model '{self.config.name}' has no output {name}")
        actual = datatypes.datatype_of(array)
        if actual != spec.datatype:
            raise ServerError(
                f"model '{self.config.name}' returned {name} as {actual}, "
                f"config says {spec.datatype}"
            )
        if not self.batches:
            return [Tensor.from_numpy(array, spec.datatype)]
        if name in self.ragged.scattered:
            return self.ragged.scatter(name, array, members, spec.datatype)
        if spec.datatype == datatypes.BYTES:  # elements of their own lengths: row by row
            bounds = np.cumsum(sizes)[:-1]
            return [Tensor.from_numpy(part, spec.datatype) for part in np.split(array, bounds)]
        data = np.ascontiguousarray(array, dtype=datatypes.numpy_dtype(spec.datatype)).tobytes()
        inner = tuple(int(d) for d in array.shape[1:])
        row_bytes = len(data) // array.shape[0] if array.shape[0] else 0
        parts, offset = [], 0
        for rows in sizes:
            end = offset + rows * row_bytes
            parts.append(Tensor(spec.datatype, (rows, *inner), data[offset:end]))
            offset = end
        return parts


def short_message(exc: Exception) -> str:
    """The runtime's own words, without a traceback or serialized code.

    TorchScript puts the reason last, after the serialized code that raised it; other
    runtimes put it first.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return "no message"
    traced = any("Traceback" in line for line in lines)
    text = lines[-1] if traced else lines[0]
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
