"""Triton's ``optimization`` block of a model config, as Weir keeps it.

``graph.level`` and ``execution_accelerators`` are acted on by the backends that have them
(ONNX Runtime, OpenVINO); the rest is accepted and kept as given.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Accelerator(_Strict):
    """One ``execution_accelerators`` entry: a name (``tensorrt``, ``openvino``...)."""

    name: str = Field(min_length=1)
    parameters: dict[str, str] = Field(default_factory=dict)


class ExecutionAccelerators(_Strict):
    """Triton's ``optimization.execution_accelerators``, kept for the backends that use it."""

    gpu_execution_accelerator: tuple[Accelerator, ...] = ()
    cpu_execution_accelerator: tuple[Accelerator, ...] = ()


class GraphOptimization(_Strict):
    """``optimization.graph.level``; ONNX Runtime reads -1 basic, 1 extended, 2 none."""

    level: int = 0


class Optimization(_Strict):
    """Triton's ``optimization`` block.

    ``graph`` and ``execution_accelerators`` are acted on by the backends that have them; the
    rest is accepted and kept as given.
    """

    graph: GraphOptimization | None = None
    execution_accelerators: ExecutionAccelerators | None = None
    priority: str | None = None
    cuda: dict[str, Any] | None = None
    input_pinned_memory: dict[str, Any] | None = None
    output_pinned_memory: dict[str, Any] | None = None
    gather_kernel_buffer_threshold: int | None = None
    eager_batching: bool | None = None
