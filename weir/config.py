"""Model configuration with the field names of Triton's ``model_config.proto``.

``config.yaml`` (or ``config.pbtxt``, :mod:`weir.pbtxt`) is parsed into these models; a bad
file stops start-up with a :class:`~weir.errors.ConfigError` naming the file and the field.
Datatypes are accepted as config names (``TYPE_FP32``) or protocol names (``FP32``) and held
as protocol names. An ensemble's ``ensemble_scheduling`` is in :mod:`weir.config_ensemble`,
``model_warmup`` in :mod:`weir.config_warmup`, ``sequence_batching`` in :mod:`weir.config_sequence`.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from weir import config_parameters as params
from weir import datatypes
from weir.config_batching import DynamicBatching
from weir.config_ensemble import EnsembleScheduling, check_ensemble_fields
from weir.config_optimization import Optimization
from weir.config_ragged import BatchInput, BatchOutput, batch_input_specs, check_ragged_fields
from weir.config_sequence import SequenceBatching, check_sequence_fields, run_tensors
from weir.config_warmup import ModelWarmup, check_warmup_fields
from weir.errors import ConfigError

logger = logging.getLogger(__name__)

# Triton fields that a config may carry and Weir does not act on yet: loaded with a warning.
IGNORED_TRITON_FIELDS = frozenset(
    {
        "model_operations",
        "model_metrics",
        "metric_tags",
        "cc_model_filenames",
        "model_repository_agents",
        "runtime",
    }
)


class Backend(StrEnum):
    """Backends by Triton's names."""

    PYTORCH = "pytorch"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"
    TENSORRT = "tensorrt"
    PYTHON = "python"
    TORCHSERVE = "torchserve"  # a TorchServe model archive (.mar) with its handler
    ENSEMBLE = "ensemble"


BACKEND_ALIASES: dict[str, Backend] = {
    "pytorch": Backend.PYTORCH,
    "torch": Backend.PYTORCH,
    "pytorch_libtorch": Backend.PYTORCH,
    "onnxruntime": Backend.ONNXRUNTIME,
    "onnxruntime_onnx": Backend.ONNXRUNTIME,
    "openvino": Backend.OPENVINO,
    "tensorrt": Backend.TENSORRT,
    "tensorrt_plan": Backend.TENSORRT,
    "python": Backend.PYTHON,
    "torchserve": Backend.TORCHSERVE,
    "ensemble": Backend.ENSEMBLE,
}


class InstanceKind(StrEnum):
    """Where a model's instances run (Triton's ``instance_group.kind``)."""

    AUTO = "KIND_AUTO"
    CPU = "KIND_CPU"
    GPU = "KIND_GPU"
    MODEL = "KIND_MODEL"


def plain_filename(value: str, where: str) -> str:
    """``value`` if it names a file directly inside ``where`` (no path, no ``..``)."""
    if value in (".", "..") or "/" in value or "\\" in value:
        raise ValueError(f"{value!r} must name a file in {where}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """One ``input`` or ``output`` entry."""

    name: str = Field(min_length=1)
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False
    allow_ragged_batch: bool = False  # an input's (weir.config_ragged)
    # An output's class labels, one per line, in the model directory (classification).
    label_filename: str = ""

    @field_validator("label_filename")
    @classmethod
    def _label_file_inside(cls, value: str) -> str:
        return plain_filename(value, "the model directory")

    @field_validator("data_type")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        return datatypes.protocol_name(value)

    @field_validator("dims")
    @classmethod
    def _valid_dims(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(d == 0 or d < -1 for d in value):
            raise ValueError(f"dims {list(value)}: each dim is -1 (variable) or positive")
        return value

    @property
    def datatype(self) -> str:
        """The protocol datatype name (``FP32``, ``BYTES``...)."""
        return self.data_type


class InstanceGroup(_Strict):
    """One ``instance_group`` entry."""

    name: str = ""
    kind: InstanceKind = InstanceKind.AUTO
    count: int = Field(default=1, ge=1)
    gpus: tuple[int, ...] = ()


class LatestPolicy(_Strict):
    """Serve the newest ``num_versions`` versions."""

    num_versions: int = Field(default=1, ge=1)


class SpecificPolicy(_Strict):
    """Serve exactly the listed versions."""

    versions: tuple[int, ...] = Field(min_length=1)


class VersionPolicy(_Strict):
    """Exactly one of ``latest``, ``all`` or ``specific``."""

    latest: LatestPolicy | None = None
    all: dict[str, Any] | None = None
    specific: SpecificPolicy | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_latest(cls, raw: Any) -> Any:
        # An empty policy is Triton's default: the latest version only.
        return raw or {"latest": {}}

    @model_validator(mode="after")
    def _one_of(self) -> VersionPolicy:
        chosen = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise ValueError(f"set only one of latest, all, specific (got {', '.join(chosen)})")
        return self

    def select(self, available: list[int]) -> list[int]:
        """The versions this policy serves out of those on disk, ascending."""
        ordered = sorted(available)
        if self.all is not None:
            return ordered
        if self.specific is not None:
            return [v for v in ordered if v in self.specific.versions]
        keep = (self.latest or LatestPolicy()).num_versions
        return ordered[-keep:]


class TransactionPolicy(_Strict):
    """``model_transaction_policy``: a decoupled model sends parts of its answers as it runs."""

    decoupled: bool = False


class ResponseCache(_Strict):
    """``response_cache``: answers kept by the request's inputs (the gateway's cache)."""

    enable: bool = False


class ModelConfig(_Strict):
    """A model's ``config.yaml``: the subset of ``model_config.proto`` Weir implements."""

    name: str
    backend: Backend
    max_batch_size: int = Field(default=0, ge=0)
    input: tuple[TensorSpec, ...] = Field(min_length=1)
    output: tuple[TensorSpec, ...] = Field(min_length=1)
    batch_input: tuple[BatchInput, ...] = ()
    batch_output: tuple[BatchOutput, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    sequence_batching: SequenceBatching | None = None
    instance_group: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    version_policy: VersionPolicy = VersionPolicy(latest=LatestPolicy())
    parameters: dict[str, str] = Field(default_factory=dict)
    ensemble_scheduling: EnsembleScheduling | None = None
    optimization: Optimization | None = None
    model_transaction_policy: TransactionPolicy | None = None
    response_cache: ResponseCache | None = None
    # The model file in each version directory; empty: the backend's (model.onnx...).
    default_model_filename: str = ""
    # Samples each instance runs before it serves (workers.warmup).
    model_warmup: tuple[ModelWarmup, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            raise ValueError("a model config is a mapping of field names to values")
        raw = dict(raw)
        _pick_backend(raw)
        raw["parameters"] = params.flatten_parameters(raw.get("parameters") or {})
        if raw["backend"] is Backend.ENSEMBLE:
            # A pipeline runs no instances of its own: each step runs in its model's pool.
            raw.setdefault("instance_group", ())
        return raw

    @field_validator("default_model_filename")
    @classmethod
    def _plain_filename(cls, value: str) -> str:
        return plain_filename(value, "the version directory")

    @property
    def decoupled(self) -> bool:
        policy = self.model_transaction_policy
        return policy is not None and policy.decoupled

    @property
    def caches_responses(self) -> bool:
        """``response_cache { enable: true }`` and not decoupled (Triton caches no stream)."""
        cache = self.response_cache
        stateful = self.sequence_batching is not None
        return cache is not None and cache.enable and not self.decoupled and not stateful

    @property
    def max_input_bytes(self) -> int | None:
        """Weir's ``max_input_bytes`` parameter: the most input bytes one request may carry."""
        raw = self.parameters.get(params.MAX_INPUT_BYTES)
        return None if raw is None else int(raw)

    @property
    def response_timeout_s(self) -> float | None:
        """Weir's ``response_timeout_s`` parameter: the longest one batch may run."""
        return params.seconds_or_none(self.parameters, params.RESPONSE_TIMEOUT_S)

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        params.check_parameters(self.parameters)
        _unique_names("input", self.input)
        _unique_names("output", self.output)
        check_ensemble_fields(self)
        check_warmup_fields(self)
        check_sequence_fields(self)
        check_ragged_fields(self)
        preferred = self.dynamic_batching.preferred_batch_size if self.dynamic_batching else ()
        if preferred and max(preferred) > max(self.max_batch_size, 1):
            raise ValueError(
                f"preferred_batch_size {max(preferred)} exceeds max_batch_size "
                f"{self.max_batch_size}"
            )
        return self

    def run_config(self) -> ModelConfig:
        """The config an instance runs with: control, state and batch inputs too."""
        inputs, outputs = run_tensors(self)
        inputs += batch_input_specs(self)
        if not inputs and not outputs:
            return self
        return self.model_copy(
            update={"input": (*self.input, *inputs), "output": (*self.output, *outputs)}
        )

    def input_spec(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.input if spec.name == name), None)

    def output_spec(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.output if spec.name == name), None)

    def full_shape(self, spec: TensorSpec) -> list[int]:
        """The shape a client sees: ``[-1] + dims`` when the model batches."""
        return [-1, *spec.dims] if self.max_batch_size > 0 else list(spec.dims)

    def instance_kinds(self) -> set[InstanceKind]:
        return {group.kind for group in self.instance_group}

    @property
    def is_ensemble(self) -> bool:
        """True for a pipeline (``platform: ensemble``), which no worker runs itself."""
        return self.backend is Backend.ENSEMBLE


def _pick_backend(raw: dict[str, Any]) -> None:
    backend = raw.pop("backend", None)
    platform = raw.pop("platform", None)
    name = backend or platform
    if name is None:
        raise ValueError(
            "set backend (pytorch, onnxruntime, openvino, tensorrt, python) or platform"
        )
    resolved = BACKEND_ALIASES.get(str(name))
    if resolved is None:
        raise ValueError(f"unknown backend {name!r}; expected one of {sorted(BACKEND_ALIASES)}")
    raw["backend"] = resolved


def _unique_names(field: str, specs: tuple[TensorSpec, ...]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"{field} name {spec.name!r} appears twice")
        seen.add(spec.name)


def read_yaml(path: Path) -> dict[str, Any]:
    """One ``config.yaml`` as a dict, not yet validated."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: config: a model config is a mapping of field names to values")
    return raw


def load_config(path: Path, default_name: str) -> ModelConfig:
    """Parse one ``config.yaml``; every problem raises ConfigError naming file and field."""
    return config_from_raw(read_yaml(path), path, default_name)


def config_from_raw(raw: Any, path: Path, default_name: str) -> ModelConfig:
    """Validate a parsed config (from YAML or ``config.pbtxt``) read from ``path``."""
    if isinstance(raw, dict):
        raw.setdefault("name", default_name)
        for ignored in IGNORED_TRITON_FIELDS.intersection(raw):
            logger.warning("%s: field %s is not supported yet and is ignored", path, ignored)
            raw.pop(ignored)
    try:
        config = ModelConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_describe(exc)}") from None
    if config.name != default_name:
        raise ConfigError(
            f"{path}: name: {config.name!r} does not match its directory {default_name!r}"
        )
    return config


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "config"
        message = str(error["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}")
    return "; ".join(problems)
