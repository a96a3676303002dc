"""An ensemble's step graph, checked against the models its steps name.

:class:`~weir.repository.Repository` calls :func:`check_ensemble` for every entry once all
models are loaded, so the gateway, the batcher and every worker refuse a broken pipeline at
start-up with the same message. A message names the config file, the pipeline, the step
(by index and model name) and the tensor. What is refused:

- a step naming an unknown model, a version its model does not serve, or another ensemble;
- a step whose model batches less than the pipeline (``max_batch_size`` below the
  pipeline's), or that does not batch when the pipeline does;
- an ``input_map`` key that is not an input of the step's model, a required model input
  left unmapped, an ``output_map`` key that is not an output of the model;
- a tensor produced twice (by two steps, or by a step and as a pipeline input);
- a tensor a step consumes that is neither a pipeline input nor a step's output, and a
  pipeline output that nothing produces;
- a datatype or shape mismatch between a tensor's producer and a consumer (a pipeline
  input's spec vs a step's input spec, a step's output spec vs a consumer's input spec or
  the pipeline's output spec). Shapes compare as clients see them (``[-1] + dims`` for a
  batching model); ``-1`` matches any size;
- a cycle.

:func:`resolve_ensemble` returns the steps in dependency order; ``pipelines/`` builds its
runtime plan on it. This module stays in ``weir/`` because the repository must run it and
``weir/`` never imports a service package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weir.config import ModelConfig, TensorSpec
from weir.config_ensemble import EnsembleStep
from weir.errors import ConfigError

if TYPE_CHECKING:
    from weir.repository import ModelEntry


@dataclass(frozen=True, slots=True)
class ResolvedStep:
    """One step with the model entry and the version it runs."""

    index: int
    step: EnsembleStep
    entry: ModelEntry
    version: str

    @property
    def config(self) -> ModelConfig:
        return self.entry.config

    @property
    def label(self) -> str:
        return f"step {self.index} ({self.step.model_name})"


@dataclass(frozen=True, slots=True)
class _Producer:
    label: str
    config: ModelConfig
    spec: TensorSpec


def check_ensemble(entry: ModelEntry, models: Mapping[str, ModelEntry]) -> None:
    """Raise ConfigError if ``entry`` is an ensemble whose graph is broken."""
    if entry.config.is_ensemble:
        resolve_ensemble(entry, models)


def resolve_ensemble(
    entry: ModelEntry, models: Mapping[str, ModelEntry]
) -> tuple[ResolvedStep, ...]:
    """The ensemble's steps, each after every step that feeds it; ConfigError if broken."""
    where = f"{entry.config_file}: pipeline '{entry.name}'"
    config = entry.config
    if config.ensemble_scheduling is None:
        raise ConfigError(f"{where}: not an ensemble")
    steps = [
        _resolve_step(where, config, index, step, models)
        for index, step in enumerate(config.ensemble_scheduling.step)
    ]
    producers = _producers(where, config, steps)
    for step in steps:
        _check_inputs(where, step, producers)
    _check_outputs(where, config, producers)
    return _ordered(where, config, steps)


def _resolve_step(
    where: str,
    pipeline: ModelConfig,
    index: int,
    step: EnsembleStep,
    models: Mapping[str, ModelEntry],
) -> ResolvedStep:
    here = f"{where}: step {index} ({step.model_name})"
    entry = models.get(step.model_name)
    if entry is None:
        raise ConfigError(f"{here}: unknown model '{step.model_name}'")
    if entry.config.is_ensemble:
        raise ConfigError(
            f"{here}: model '{step.model_name}' is an ensemble; nesting is not supported"
        )
    resolved = ResolvedStep(index, step, entry, _version(here, step, entry))
    _check_batching(here, pipeline, resolved.config)
    _check_maps(here, step, resolved.config)
    return resolved


def _version(here: str, step: EnsembleStep, entry: ModelEntry) -> str:
    if step.model_version == -1:
        return entry.latest
    version = str(step.model_version)
    if version not in entry.versions:
        raise ConfigError(
            f"{here}: model_version {version}: model '{entry.name}' serves "
            f"version {', '.join(entry.versions)} only"
        )
    return version


def _check_batching(here: str, pipeline: ModelConfig, model: ModelConfig) -> None:
    if model.max_batch_size < pipeline.max_batch_size:
        raise ConfigError(
            f"{here}: max_batch_size {model.max_batch_size} of model '{model.name}' is below "
            f"the pipeline's {pipeline.max_batch_size}"
        )


def _check_maps(here: str, step: EnsembleStep, model: ModelConfig) -> None:
    inputs = [spec.name for spec in model.input]
    outputs = [spec.name for spec in model.output]
    for name in step.input_map:
        if name not in inputs:
            raise ConfigError(
                f"{here}: input_map: '{name}' is not an input of model '{model.name}' "
                f"(inputs: {', '.join(inputs)})"
            )
    for spec in model.input:
        if spec.name not in step.input_map and not spec.optional:
            raise ConfigError(f"{here}: input_map: model input '{spec.name}' is not mapped")
    for name in step.output_map:
        if name not in outputs:
            raise ConfigError(
                f"{here}: output_map: '{name}' is not an output of model '{model.name}' "
                f"(outputs: {', '.join(outputs)})"
            )


def _producers(
    where: str, pipeline: ModelConfig, steps: list[ResolvedStep]
) -> dict[str, _Producer]:
    producers = {spec.name: _Producer("pipeline input", pipeline, spec) for spec in pipeline.input}
    for step in steps:
        for model_output, tensor in step.step.output_map.items():
            other = producers.get(tensor)
            if other is not None:
                raise ConfigError(
                    f"{where}: {step.label}: tensor '{tensor}' is produced twice "
                    f"(also by {other.label})"
                )
            spec = step.config.output_spec(model_output)
            if spec is not None:
                producers[tensor] = _Producer(step.label, step.config, spec)
    return producers


def _check_inputs(where: str, step: ResolvedStep, producers: Mapping[str, _Producer]) -> None:
    for model_input, tensor in step.step.input_map.items():
        producer = producers.get(tensor)
        if producer is None:
            raise ConfigError(
                f"{where}: {step.label}: tensor '{tensor}' (for input '{model_input}') is "
                f"neither a pipeline input nor a step's output"
            )
        spec = step.config.input_spec(model_input)
        if spec is not None:
            consumer = f"{step.label} input '{model_input}'"
            _check_match(where, tensor, producer, consumer, step.config, spec)


def _check_outputs(where: str, pipeline: ModelConfig, producers: Mapping[str, _Producer]) -> None:
    for spec in pipeline.output:
        producer = producers.get(spec.name)
        if producer is None:
            raise ConfigError(
                f"{where}: output tensor '{spec.name}' is produced by no step's output_map"
            )
        _check_match(where, spec.name, producer, "pipeline output", pipeline, spec)


def _check_match(
    where: str,
    tensor: str,
    producer: _Producer,
    consumer: str,
    consumer_config: ModelConfig,
    consumer_spec: TensorSpec,
) -> None:
    produced = (producer.spec.datatype, producer.config.full_shape(producer.spec))
    taken = (consumer_spec.datatype, consumer_config.full_shape(consumer_spec))
    if produced[0] != taken[0] or not _shapes_match(produced[1], taken[1]):
        raise ConfigError(
            f"{where}: tensor '{tensor}': {producer.label} gives {produced[0]} {produced[1]}, "
            f"{consumer} takes {taken[0]} {taken[1]}"
        )


def _shapes_match(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _ordered(
    where: str, pipeline: ModelConfig, steps: list[ResolvedStep]
) -> tuple[ResolvedStep, ...]:
    """Steps in dependency order (declaration order among ready steps); ConfigError on a cycle."""
    available = {spec.name for spec in pipeline.input}
    pending = list(steps)
    ordered: list[ResolvedStep] = []
    while pending:
        ready = [s for s in pending if available.issuperset(s.step.input_map.values())]
        if not ready:
            raise ConfigError(f"{where}: {_describe_cycle(pending, available)}")
        for step in ready:
            pending.remove(step)
            ordered.append(step)
            available.update(step.step.output_map.values())
    return tuple(ordered)


def _describe_cycle(pending: list[ResolvedStep], available: set[str]) -> str:
    # Every tensor has a producer (checked before), so walking from a blocked step to the
    # producer of a tensor it lacks must come back to a step already seen: the cycle.
    producer = {t: s for s in pending for t in s.step.output_map.values()}
    path: list[tuple[ResolvedStep, str]] = []
    step = pending[0]
    while step not in [seen for seen, _ in path]:
        tensor = next(t for t in step.step.input_map.values() if t not in available)
        path.append((step, tensor))
        step = producer[tensor]
    cycle = path[[seen for seen, _ in path].index(step) :]
    first, tensor = cycle[0]
    route = " -> ".join(f"{s.label} needs '{t}'" for s, t in cycle)
    return f"{first.label}: tensor '{tensor}' is part of a cycle: {route} -> {first.label}"
