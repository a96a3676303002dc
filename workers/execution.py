"""Running one batch: concatenate the members' inputs, run the backend, split the outputs.

Members whose non-batch dimensions differ cannot share one tensor, so a batch runs as one
backend call per run of members with equal shapes. Every call must return one output row
per input row; a call that fails fails each of its members with the same error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import groupby

import numpy as np

from weir import datatypes
from weir.config import ModelConfig
from weir.errors import ServerError, WeirError
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest, now_ns
from workers.backends.base import ModelBackend

logger = logging.getLogger(__name__)


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

    def __init__(self, config: ModelConfig, backend: ModelBackend) -> None:
        self.config = config
        self.backend = backend
        self.batches = config.max_batch_size > 0

    def run(self, requests: list[InferRequest]) -> tuple[list[InferReply], list[int]]:
        """One reply per request, in order, and the batch size of each backend call made.

        Called in an executor thread.
        """
        replies, executions = self.run_batch(requests)
        return replies, [execution.batch_size for execution in executions]

    def run_batch(self, requests: list[InferRequest]) -> tuple[list[InferReply], list[Execution]]:
        """One reply per request, in order, and each backend call made, timed.

        Called in an executor thread.
        """
        replies: list[InferReply] = []
        executions: list[Execution] = []
        for _, group in groupby(requests, key=self._shape_key):
            members = list(group)
            group_replies, phases_ns = self._run_group(members)
            replies.extend(group_replies)
            executions.append(Execution(sum(self._rows(r) for r in members), phases_ns))
        return replies, executions

    def _shape_key(self, request: InferRequest) -> tuple[tuple[int, ...] | None, ...]:
        # Members batch together only when they carry the same inputs with the same shapes.
        skip = 1 if self.batches else 0
        return tuple(
            request.inputs[spec.name].shape[skip:] if spec.name in request.inputs else None
            for spec in self.config.input
        )

    def _run_group(
        self, members: list[InferRequest]
    ) -> tuple[list[InferReply], tuple[int, int, int] | None]:
        try:
            return self._execute(members)
        except WeirError as exc:
            return [InferReply.failure(r, exc) for r in members], None
        except Exception as exc:
            logger.exception("model %s failed on a batch of %d", self.config.name, len(members))
            error = ServerError(f"model '{self.config.name}' failed: {type(exc).__name__}: {exc}")
            return [InferReply.failure(r, error) for r in members], None

    def _execute(
        self, members: list[InferRequest]
    ) -> tuple[list[InferReply], tuple[int, int, int]]:
        started = now_ns()
        sizes = [self._rows(r) for r in members]
        present = [spec.name for spec in self.config.input if spec.name in members[0].inputs]
        inputs = {name: self._gather(name, members) for name in present}
        computed = now_ns()
        outputs = self.backend.infer(inputs)
        inferred = now_ns()
        per_member = self._split(outputs, sizes)
        replies = [self._reply(r, out) for r, out in zip(members, per_member, strict=True)]
        done = now_ns()
        stamps = {
            "compute_start": started,
            "compute_input_end": computed,
            "compute_infer_end": inferred,
            "compute_end": done,
        }
        for reply in replies:
            reply.ts.update(stamps)
        return replies, (computed - started, inferred - computed, done - inferred)

    def _rows(self, request: InferRequest) -> int:
        if not self.batches:
            return 1
        return next(iter(request.inputs.values())).shape[0]

    def _gather(self, name: str, members: list[InferRequest]) -> np.ndarray:
        arrays = [r.inputs[name].to_numpy() for r in members]
        if not self.batches:
            return arrays[0].copy()
        # concatenate copies, so the backend gets a writable array it may hand to torch.
        return np.concatenate(arrays, axis=0)

    def _split(
        self, outputs: dict[str, np.ndarray], sizes: list[int]
    ) -> list[dict[str, np.ndarray]]:
        if not self.batches:
            return [outputs]
        total = sum(sizes)
        for name, array in outputs.items():
            if array.ndim == 0 or array.shape[0] != total:
                raise ServerError(
                    f"model '{self.config.name}' returned {name} with shape {list(array.shape)} "
                    f"for a batch of {total}: one output row per input row is required"
                )
        bounds = np.cumsum(sizes)[:-1]
        split = {name: np.split(array, bounds) for name, array in outputs.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(sizes))]

    def _reply(self, request: InferRequest, outputs: dict[str, np.ndarray]) -> InferReply:
        wanted = request.outputs or [spec.name for spec in self.config.output]
        tensors = {name: self._tensor(name, outputs[name]) for name in wanted}
        return InferReply(request.id, request.model, request.version, tensors, ts=dict(request.ts))

    def _tensor(self, name: str, array: np.ndarray) -> Tensor:
        spec = self.config.output_spec(name)
        if spec is None:
            raise ServerError(f"model '{self.config.name}' has no output {name}")
        actual = datatypes.datatype_of(array)
        if actual != spec.datatype:
            raise ServerError(
                f"model '{self.config.name}' returned {name} as {actual}, "
                f"config says {spec.datatype}"
            )
        return Tensor.from_numpy(array, spec.datatype)
