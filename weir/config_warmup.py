"""Triton's ``model_warmup``: samples an instance runs before it serves.

Each ``ModelWarmup`` names a sample, its ``batch_size`` and its ``inputs``; the worker runs
it ``count`` times (0 means once) through the path real batches take
(:mod:`workers.warmup`), so that lazy initialisation (allocator pools, kernel selection,
JIT compilation) is paid before the first request rather than by it. The field names and
their meaning are those of ``model_config.proto``:

- ``batch_size``: the rows of the sample; each input's data is repeated once per row. A
  sample with ``batch_size`` 0 (also what a ``config.pbtxt`` that leaves it out reads as) is
  skipped, as Triton skips it. A model that does not batch takes 1.
- ``inputs``: per model input, ``data_type``, ``dims`` (without the batch dimension, every
  dim given: a warm-up has no variable dims) and one source of data: ``zero_data``,
  ``random_data`` or ``input_data_file``, a file in the model directory's ``warmup/``
  folder holding one row's raw little-endian bytes (for ``TYPE_STRING``, each element as a
  4-byte length followed by its bytes).

Only the shape of a sample is checked by the models here; :func:`check_warmup_fields`
checks it against the model's inputs, and the data files are read when the worker runs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from weir import datatypes

if TYPE_CHECKING:
    from weir.config import ModelConfig, TensorSpec

WARMUP_FOLDER = "warmup"
_SOURCES = ("zero_data", "random_data", "input_data_file")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WarmupInput(_Strict):
    """Triton's ``ModelWarmup.Input``: one input's datatype, dims and source of data."""

    data_type: str
    dims: tuple[int, ...] = ()
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str = ""

    @field_validator("data_type")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        return datatypes.protocol_name(value)

    @field_validator("dims")
    @classmethod
    def _fixed_dims(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(d < 1 for d in value):
            raise ValueError(f"dims {list(value)}: each dim is positive (a sample has a shape)")
        return value

    @field_validator("input_data_file")
    @classmethod
    def _file_in_warmup_folder(cls, value: str) -> str:
        # weir.config imports this module: its helper is imported when first needed.
        from weir.config import plain_filename

        return plain_filename(value, f"the model directory's {WARMUP_FOLDER}/ folder")

    @model_validator(mode="after")
    def _one_source(self) -> WarmupInput:
        chosen = [name for name in _SOURCES if getattr(self, name)]
        if len(chosen) != 1:
            got = ", ".join(chosen) or "none"
            raise ValueError(f"set exactly one of {', '.join(_SOURCES)} (got {got})")
        return self


class ModelWarmup(_Strict):
    """Triton's ``ModelWarmup``: one named sample."""

    name: str = Field(min_length=1)
    batch_size: int = Field(default=0, ge=0)
    inputs: dict[str, WarmupInput] = Field(default_factory=dict)
    count: int = Field(default=0, ge=0)

    @property
    def runs(self) -> int:
        """How many times the sample runs: ``count``, at least once (Triton's 0 is once)."""
        return max(self.count, 1)


def check_warmup_fields(config: ModelConfig) -> None:
    """Raise ValueError, naming the field, unless every sample fits the model's inputs."""
    if config.model_warmup and config.is_ensemble:
        raise ValueError("model_warmup: an ensemble runs no instances of its own to warm up")
    for index, sample in enumerate(config.model_warmup):
        where = f"model_warmup.{index}"
        _check_batch_size(config, sample, where)
        problem = next(_input_problems(config, sample, where), None)
        if problem is not None:
            raise ValueError(problem)


def _check_batch_size(config: ModelConfig, sample: ModelWarmup, where: str) -> None:
    limit = config.max_batch_size
    if limit and sample.batch_size > limit:
        raise ValueError(f"{where}.batch_size: {sample.batch_size} exceeds max_batch_size {limit}")
    if not limit and sample.batch_size > 1:
        raise ValueError(
            f"{where}.batch_size: a model with max_batch_size 0 does not batch; "
            f"batch_size is 1, not {sample.batch_size}"
        )


def _input_problems(config: ModelConfig, sample: ModelWarmup, where: str) -> Iterator[str]:
    for name, given in sample.inputs.items():
        spec = config.input_spec(name)
        if spec is None:
            yield f"{where}.inputs.{name}: the model has no input named {name!r}"
        else:
            yield from _mismatches(spec, given, f"{where}.inputs.{name}")
    for spec in config.input:
        if not spec.optional and spec.name not in sample.inputs:
            yield f"{where}.inputs: no data for input {spec.name!r}, which is not optional"


def _mismatches(spec: TensorSpec, given: WarmupInput, where: str) -> Iterator[str]:
    if given.data_type != spec.datatype:
        yield f"{where}.data_type: {given.data_type}, but input {spec.name!r} is {spec.datatype}"
    if not dims_fit(given.dims, spec.dims):
        yield f"{where}.dims: {list(given.dims)} do not fit input {spec.name!r}, {list(spec.dims)}"


def dims_fit(dims: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    """True when ``dims`` has ``declared``'s rank and matches it where it is not ``-1``."""
    if len(dims) != len(declared):
        return False
    return all(want in (-1, got) for got, want in zip(dims, declared, strict=True))
