"""What this gateway serves: the models of the current desired state, and where to route.

The catalog stands where the repository stood (``resolve``, iteration, ``models``) and
changes with the desired state (:mod:`weir.control`). A request that names no version goes
to a version that a live worker serves, chosen by the model's traffic weights when it has
some, else the newest; while a new version warms up, requests keep going to the version it
replaces. A request that names a version always gets that version.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

from redis.asyncio import Redis

from pipelines.graph import Pipeline, load_pipelines
from pipelines.route import Router
from weir.control.desired import DesiredState
from weir.errors import NotFound, Unavailable
from weir.repository import ModelEntry, Repository, shown
from weir.workload import MeshView

logger = logging.getLogger(__name__)


class Catalog:
    """The served models by name, and the mesh's view of who serves them."""

    def __init__(self, redis: Redis, repository: Repository) -> None:
        self.redis = redis
        self.root = repository.root
        self.models: dict[str, ModelEntry] = dict(repository.models)
        self.router = Router(redis, load_pipelines(repository))
        self.view = MeshView()
        self.weights: dict[str, dict[str, int]] = {}
        self.reasons: dict[str, str] = {}
        # Versions of earlier generations: a request with no version may still go there
        # while the versions replacing them warm up (their lanes serve until drained).
        self.earlier: dict[str, set[str]] = {}
        self.generation = 0
        # The models server readiness waits for: those of the first state this gateway
        # serves and those served since (a model that failed to load is not waited for).
        self.counted: set[str] | None = None
        # Versions that failed to load and that no live worker serves, and why.
        self.failed: dict[tuple[str, str], str] = {}

    @property
    def pipelines(self) -> dict[str, Pipeline]:
        return self.router.pipelines

    def apply(self, state: DesiredState) -> None:
        """Serve what ``state`` says; a state this gateway cannot build changes nothing."""
        repository = state.repository(self.root)
        for name, entry in self.models.items():
            self.earlier.setdefault(name, set()).update(entry.versions)
        self.models = dict(repository.models)
        self.router = Router(self.redis, load_pipelines(repository))
        self.weights = {n: dict(m.weights) for n, m in state.models.items() if m.weights}
        self.reasons = dict(state.reasons)
        self.generation = state.generation
        if self.counted is None:
            self.counted = set(self.models)
        self.failed = self._failed()  # a load asked again is a new attempt, not failed yet
        logger.info(
            "serving generation %d: %s",
            state.generation,
            ", ".join(sorted(self.models)) or "nothing",
        )

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(list(self.models.values()))

    def resolve(self, name: str, version: str | None = None) -> tuple[ModelEntry, str]:
        """The model and the version to serve; a missing version is routed (module doc)."""
        entry = self.models.get(name)
        if entry is None:
            reason = self.reasons.get(name)
            detail = f" ({shown(reason)})" if reason else ""
            raise NotFound(f"Request for unknown model: '{shown(name)}' is not found{detail}")
        if not version:
            return entry, self.route(entry)
        if version not in entry.versions:
            raise NotFound(
                f"Request for unknown model: '{shown(name)}' version {shown(version)} is not found"
            )
        return entry, version

    def route(self, entry: ModelEntry) -> str:
        """The version a request naming none goes to."""
        alone = len(entry.versions) == 1 and not self.earlier.get(entry.name)
        if alone or entry.config.is_ensemble:
            return entry.latest
        live = [v for v in entry.versions if self.view.serves(entry.name, v)]
        weights = self.weights.get(entry.name)
        if weights:
            # Among the weighted versions served; while none is (yet), among them all.
            weighted = [v for v in live if weights.get(v, 0) > 0] or [
                v for v in entry.versions if weights.get(v, 0) > 0
            ]
            return random.choices(weighted, [weights[v] for v in weighted])[0]
        if live:
            return live[-1]
        earlier = self.earlier.get(entry.name, set()) - set(entry.versions)
        waiting = sorted(
            (v for v in earlier if self.view.serves(entry.name, v)), key=_version_order
        )
        return waiting[-1] if waiting else entry.latest

    def answerable(self, entry: ModelEntry, served: set[tuple[str, str]]) -> bool:
        """A live worker serves a version that a request naming none may go to."""
        versions = set(entry.versions) | self.earlier.get(entry.name, set())
        return any((entry.name, v) in served for v in versions)

    def observe(self, view: MeshView) -> None:
        """Take in the live workers' view: count what they serve, forget what they left."""
        self.view = view
        counted = self.counted if self.counted is not None else set()
        for name, entry in self.models.items():
            if any(view.serves(name, v) for v in entry.versions):
                counted.add(name)
            elif any(view.failure(name, v, entry.failure_stamp(v)) for v in entry.versions):
                counted.discard(name)
        self.counted = counted
        self.failed = self._failed()
        self.forget_earlier()

    def _failed(self) -> dict[tuple[str, str], str]:
        view = self.view
        return {
            (name, version): failure
            for name, entry in self.models.items()
            for version in entry.versions
            if (failure := view.failure(name, version, entry.failure_stamp(version)))
            and not view.serves(name, version)
        }

    def check_ready(self, name: str, version: str) -> None:
        """Refuse a version that failed to load and that no live worker serves.

        Queued, its requests would wait out their deadline for nobody; Triton's words.
        """
        if self.failed:
            error = self.not_ready(name, version)
            if error is not None:
                raise error

    def not_ready(self, name: str, version: str) -> Unavailable | None:
        """Triton's error for a version, or a pipeline's step, that failed to load, unserved."""
        failed = self.failed
        failure = failed.get((name, version))
        if failure is None:
            pipeline = self.router.pipelines.get(name)
            steps = pipeline.steps if pipeline is not None else ()
            step = next((s for s in steps if (s.model, s.version) in failed), None)
            if step is None:
                return None
            failure = f"{step.label} failed to load: {failed[(step.model, step.version)]}"
        else:
            failure = f"load failed: {failure}"
        return Unavailable(f"'{shown(name)}' version {version} is not at ready state ({failure})")

    def forget_earlier(self) -> None:
        """Drop earlier versions no live worker serves any more."""
        for name, versions in self.earlier.items():
            versions.intersection_update(v for v in versions if self.view.serves(name, v))


def _version_order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (0, version)
