"""Triton's ``ensemble_scheduling`` block: the steps of a pipeline, in config form.

A pipeline is a model entry with ``platform: ensemble``. Each step names a model (and a
version, ``-1`` for the latest that model serves) and maps tensors both ways:

- ``input_map``: the step model's input name -> the pipeline tensor that feeds it;
- ``output_map``: the step model's output name -> the pipeline tensor it produces.

Pipeline tensors are the ensemble's own inputs and outputs plus the intermediate tensors
the steps produce. Only the shape of the block is checked here; the graph (every tensor
produced once, types agree, no cycle) is checked against the step models by
:mod:`weir.ensemble` when the repository loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from weir.config import ModelConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnsembleStep(_Strict):
    """One ``ensemble_scheduling.step`` entry."""

    model_name: str = Field(min_length=1)
    model_version: int = Field(default=-1, ge=-1)
    input_map: dict[str, str] = Field(default_factory=dict)
    output_map: dict[str, str] = Field(default_factory=dict)

    @field_validator("input_map", "output_map")
    @classmethod
    def _named(cls, value: dict[str, str]) -> dict[str, str]:
        for key, tensor in value.items():
            if not key or not tensor:
                raise ValueError(f"map entry {key!r}: {tensor!r}: both names must be non-empty")
        return value


class EnsembleScheduling(_Strict):
    """Triton's ``ensemble_scheduling``: the steps, in any order (the graph orders them)."""

    step: tuple[EnsembleStep, ...] = Field(min_length=1)


def check_ensemble_fields(config: ModelConfig) -> None:
    """Raise ValueError unless ``ensemble_scheduling`` and the backend agree.

    An ensemble has steps and neither instances nor a batcher of its own: each step runs
    in its model's pool and batches in its model's batcher.
    """
    if not config.is_ensemble:
        if config.ensemble_scheduling is not None:
            raise ValueError("ensemble_scheduling is only for platform: ensemble")
        return
    if config.ensemble_scheduling is None:
        raise ValueError("ensemble_scheduling: a platform: ensemble model needs its steps")
    if config.instance_group:
        raise ValueError("instance_group: an ensemble has none; each step runs in its pool")
    if config.dynamic_batching is not None:
        raise ValueError("dynamic_batching: an ensemble has none; each step batches on its own")
