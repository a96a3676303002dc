"""A pipeline as a DAG of steps, and the pure plan a request follows through it.

A pipeline is a repository entry with ``platform: ensemble`` (see ``docs/pipelines.md``).
:func:`load_pipelines` builds a :class:`Pipeline` for every ensemble of a loaded
:class:`~weir.repository.Repository`. The repository checked each graph when it loaded
(:mod:`weir.ensemble`), so building cannot fail on a repository that loaded.

Planning holds no tensors and touches no Redis. Its state is two sets of plain values a
route can carry in a request entry: the names of the pipeline tensors available so far
and the indexes of the steps already started. With any payload type for the tensors::

    plan = pipeline.plan(request.outputs)         # InvalidInput if a name is unknown
    available, started = set(pipeline.inputs), set()
    while not plan.is_complete(available):
        for step in plan.ready(available, started):   # fan-out: several steps at once
            started.add(step.index)
            outputs = run(step.model, step.version, step.model_inputs(tensors))
            produced = step.pipeline_outputs(outputs)
            tensors.update(produced)
            available.update(produced)
    reply = {name: tensors[name] for name in plan.outputs}

- :meth:`Pipeline.plan` fixes what a request returns: the tensors it names (an intermediate
  tensor too) or, when it names none, the pipeline's outputs. A plan runs only the steps
  those tensors depend on, in dependency order. It is a pure function of the pipeline and
  the requested names, so any service can rebuild it from the route.
- :meth:`Plan.ready`: the steps not yet started whose every input is available. A step fed
  by two steps (fan-in) is ready only once both have finished; two steps reading one
  tensor (fan-out) are ready together.
- :meth:`Step.model_inputs` and :meth:`Step.pipeline_outputs` map names both ways:
  pipeline tensor names to the step model's input names, the model's output names to
  pipeline tensor names (outputs not in ``output_map`` are dropped).
- :meth:`Plan.live_tensors`: the tensors a route still has to carry once ``started`` steps
  have run: the inputs of the steps still to start plus the plan's outputs.
- :meth:`Plan.is_complete`: every tensor the request returns is available.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TypeVar

from weir.config import ModelConfig
from weir.ensemble import ResolvedStep, resolve_ensemble
from weir.errors import InvalidInput, ServerError
from weir.repository import ModelEntry, Repository

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Step:
    """One step: the model version it runs and how its tensors map to the pipeline's."""

    index: int
    model: str
    version: str
    config: ModelConfig
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]

    @property
    def label(self) -> str:
        """How errors name the step: ``step 1 (model 'encoder' version 1)``."""
        return f"step {self.index} (model '{self.model}' version {self.version})"

    @property
    def needs(self) -> frozenset[str]:
        """The pipeline tensors this step reads."""
        return frozenset(self.input_map.values())

    @property
    def produces(self) -> frozenset[str]:
        """The pipeline tensors this step writes."""
        return frozenset(self.output_map.values())

    @property
    def model_outputs(self) -> list[str]:
        """The model outputs the step uses, to request from the model's worker."""
        return list(self.output_map)

    def model_inputs(self, tensors: Mapping[str, T]) -> dict[str, T]:
        """The step model's inputs, by its input names, from tensors by pipeline names."""
        missing = sorted(t for t in self.needs if t not in tensors)
        if missing:
            raise ServerError(f"{self.label}: tensor {', '.join(missing)} is not available yet")
        return {model_input: tensors[t] for model_input, t in self.input_map.items()}

    def pipeline_outputs(self, outputs: Mapping[str, T]) -> dict[str, T]:
        """The step model's outputs renamed to pipeline tensors (unmapped ones dropped)."""
        missing = [name for name in self.output_map if name not in outputs]
        if missing:
            raise ServerError(f"{self.label}: model returned no output {', '.join(missing)}")
        return {tensor: outputs[name] for name, tensor in self.output_map.items()}


@dataclass(frozen=True)
class Plan:
    """The steps one request runs and the tensors it returns."""

    outputs: tuple[str, ...]
    steps: tuple[Step, ...]

    def ready(self, available: Collection[str], started: Collection[int]) -> list[Step]:
        """The steps not yet started whose every input is available, in dependency order."""
        have = set(available)
        return [s for s in self.steps if s.index not in started and s.needs <= have]

    def is_complete(self, available: Collection[str]) -> bool:
        return set(self.outputs) <= set(available)

    def live_tensors(self, started: Collection[int]) -> frozenset[str]:
        """The tensors still needed once the ``started`` steps have run."""
        needed = {t for s in self.steps if s.index not in started for t in s.needs}
        return frozenset(needed.union(self.outputs))


@dataclass(frozen=True)
class Pipeline:
    """An ensemble's steps in dependency order, with its input and output tensor names."""

    name: str
    versions: tuple[str, ...]
    config: ModelConfig
    steps: tuple[Step, ...]

    @property
    def inputs(self) -> tuple[str, ...]:
        """The tensors a request brings."""
        return tuple(spec.name for spec in self.config.input)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The tensors a request gets back unless it names others."""
        return tuple(spec.name for spec in self.config.output)

    @classmethod
    def build(cls, entry: ModelEntry, models: Mapping[str, ModelEntry]) -> Pipeline:
        """The pipeline of an ensemble entry; ConfigError if its graph is broken."""
        steps = tuple(_step(resolved) for resolved in resolve_ensemble(entry, models))
        return cls(entry.name, entry.versions, entry.config, steps)

    @property
    def tensors(self) -> frozenset[str]:
        """Every pipeline tensor: the inputs and what the steps produce."""
        return frozenset(self.inputs).union(*(s.produces for s in self.steps))

    def step(self, index: int) -> Step:
        """The step declared at ``index`` in ``ensemble_scheduling.step``."""
        for step in self.steps:
            if step.index == index:
                return step
        raise KeyError(f"pipeline '{self.name}' has no step {index}")

    def producer(self, tensor: str) -> Step | None:
        """The step that writes ``tensor``; None for a pipeline input."""
        return next((s for s in self.steps if tensor in s.produces), None)

    def consumers(self, tensor: str) -> list[Step]:
        """The steps that read ``tensor``, in dependency order."""
        return [s for s in self.steps if tensor in s.needs]

    def plan(self, requested: Collection[str] = ()) -> Plan:
        """The plan for a request that asks for ``requested`` (none: the outputs)."""
        unknown = sorted(set(requested) - self.tensors)
        if unknown:
            raise InvalidInput(
                f"pipeline '{self.name}' has no tensor {', '.join(repr(t) for t in unknown)}"
            )
        outputs = tuple(requested) or self.outputs
        return Plan(outputs, self._steps_for(outputs))

    def _steps_for(self, outputs: Collection[str]) -> tuple[Step, ...]:
        wanted = set(outputs)
        chosen: set[int] = set()
        for step in reversed(self.steps):
            if step.produces & wanted:
                chosen.add(step.index)
                wanted.update(step.needs)
        return tuple(s for s in self.steps if s.index in chosen)


def _step(resolved: ResolvedStep) -> Step:
    return Step(
        index=resolved.index,
        model=resolved.entry.name,
        version=resolved.version,
        config=resolved.config,
        input_map=dict(resolved.step.input_map),
        output_map=dict(resolved.step.output_map),
    )


def load_pipelines(repository: Repository) -> dict[str, Pipeline]:
    """A pipeline for every ensemble in ``repository``, by name."""
    return {
        entry.name: Pipeline.build(entry, repository.models)
        for entry in repository
        if entry.config.is_ensemble
    }
