"""The model repository, in Triton's layout.

    <repository>/<model>/config.yaml          (or Triton's config.pbtxt; YAML wins if both)
    <repository>/<model>/<version>/model.pt | model.pt2 | model.py | ...

Loading reads every config and lists the numeric version directories; the version policy
picks the versions served. An ONNX or OpenVINO model needs no config, or only part of one:
what it lacks is filled from the model file and every served version's file is checked
against the result (:mod:`weir.autocomplete`, Triton's auto-complete). An ensemble (a
pipeline) may have no version directory at all, then it serves version ``1``; Triton's empty
``1/`` works too. Once every model is loaded,
each ensemble's step graph is checked against the models it names (:mod:`weir.ensemble`).
Nothing here imports a backend: the gateway and the batcher load the repository without
torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weir import autocomplete
from weir.completion import Completion
from weir.config import ModelConfig, config_from_raw, read_yaml
from weir.ensemble import check_ensemble
from weir.errors import ConfigError, NotFound

CONFIG_FILE = "config.yaml"
PBTXT_FILE = "config.pbtxt"
# Where an error in a config given with a load request says it is.
OVERRIDE_SOURCE = "(config of the load request)"
# What an ensemble without a version directory serves.
ENSEMBLE_VERSION = 1
DEFAULT_COMPLETION = Completion()


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model: its config, its directory and the versions its policy serves."""

    config: ModelConfig
    path: Path
    versions: tuple[str, ...]
    # Per served version, what identifies its config and files in a model control mode (a
    # lane serves one stamp; a new stamp is a reload). Empty in mode none.
    stamps: Mapping[str, str] = field(default_factory=dict)
    # How many times a load was asked again of this unchanged model: a lane that failed to
    # load is tried again on a new attempt.
    attempt: int = 0

    def stamp(self, version: str) -> str:
        return self.stamps.get(version, "")

    def failure_stamp(self, version: str) -> str:
        """What a worker reports a failed load of ``version`` under (per attempt)."""
        return attempt_stamp(self.stamp(version), self.attempt)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def latest(self) -> str:
        return self.versions[-1]

    def version_path(self, version: str) -> Path:
        return self.path / version

    @property
    def config_file(self) -> Path:
        """The file the config was read from (the model directory when there is none)."""
        return _config_path(self.path) or self.path


def attempt_stamp(stamp: str, attempt: int) -> str:
    """A lane's stamp as a failed load of it is reported: one per load attempt."""
    return f"{stamp}+{attempt}" if attempt else stamp


class Repository:
    """The models found under one directory, by name."""

    def __init__(self, root: Path, models: dict[str, ModelEntry]) -> None:
        self.root = root
        self.models = models

    @classmethod
    def load(cls, root: Path | str, completion: Completion = DEFAULT_COMPLETION) -> Repository:
        """Every model under ``root``.

        ``completion``: how auto-complete fills what configs leave out (the default
        ``max_batch_size`` of a model that can batch, a Python model's hook's time limit).
        """
        root = Path(root).resolve()
        if not root.is_dir():
            raise ConfigError(f"{root}: model repository is not a directory")
        models = {}
        for model_dir in model_dirs(root):
            entry = load_model(root, model_dir.name, completion)
            models[entry.name] = entry
        return cls.of(root, models)

    @classmethod
    def of(cls, root: Path, models: dict[str, ModelEntry]) -> Repository:
        """A repository of models already loaded, each pipeline checked against its steps."""
        for entry in models.values():
            check_ensemble(entry, models)
        return cls(root, models)

    def resolve(self, name: str, version: str | None = None) -> tuple[ModelEntry, str]:
        """The model and the version to serve; a missing version means the latest served."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{shown(name)}' is not found")
        if not version:
            return entry, entry.latest
        if version not in entry.versions:
            raise NotFound(
                f"Request for unknown model: '{shown(name)}' version {shown(version)} is not found"
            )
        return entry, version

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self.models.values())


SHOWN_NAME_CHARS = 128  # of a name a client sent, echoed in an error


def shown(name: str) -> str:
    """A client's name as an error echoes it: cut, so an error never grows with the request."""
    return name if len(name) <= SHOWN_NAME_CHARS else name[: SHOWN_NAME_CHARS - 3] + "..."


def _check_inside(root: Path, entry: ModelEntry) -> None:
    """Refuse a model or version directory that leads out of the repository (a symlink)."""
    for path in (entry.path, *(entry.version_path(v) for v in entry.versions)):
        if path.exists() and not path.resolve().is_relative_to(root):
            raise ConfigError(f"{path}: leads outside the model repository {root}")


def _config_path(model_dir: Path) -> Path | None:
    for name in (CONFIG_FILE, PBTXT_FILE):
        if (model_dir / name).is_file():
            return model_dir / name
    return None


def _read_raw(model_dir: Path, config_path: Path | None) -> dict[str, Any]:
    if config_path is None:
        return {}
    if config_path.name == CONFIG_FILE:
        return read_yaml(config_path)
    # protobuf and tritonclient's messages cost ~20 MB per process: only when needed.
    from weir.pbtxt import read_pbtxt

    return read_pbtxt(config_path)


def model_dirs(root: Path) -> list[Path]:
    """The model directories under ``root``, by name."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def load_model(
    root: Path,
    name: str,
    completion: Completion = DEFAULT_COMPLETION,
    override: dict[str, Any] | None = None,
) -> ModelEntry:
    """One model of the repository at ``root``; ``override``: a config that replaces its file's.

    ConfigError, naming the file and the field, for anything wrong with it.
    """
    model_dir = root / name
    if not name or name != model_dir.name or not model_dir.is_dir():
        raise ConfigError(f"{root}: no model directory named '{shown(name)}'")
    entry = _load_model(model_dir, completion, override)
    _check_inside(root, entry)
    return entry


def _load_model(
    model_dir: Path, completion: Completion, override: dict[str, Any] | None = None
) -> ModelEntry:
    config_path = _config_path(model_dir)
    raw = _read_raw(model_dir, config_path) if override is None else dict(override)
    available = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if config_path is None and override is None:
        backend = autocomplete.guess_backend(model_dir, available)
        if backend is None:
            raise ConfigError(
                f"{model_dir}: no {CONFIG_FILE} or {PBTXT_FILE}, and no model.onnx or "
                "model.xml in a version directory to fill one from"
            )
        raw["backend"] = backend
    source = model_dir / OVERRIDE_SOURCE if override is not None else config_path or model_dir
    raw = autocomplete.complete(raw, model_dir, available, completion)
    config = config_from_raw(raw, source, model_dir.name)
    if config.is_ensemble and not available:
        available = [ENSEMBLE_VERSION]
    served = config.version_policy.select(available)
    if not served:
        raise ConfigError(
            f"{source}: version_policy: no version directory to serve "
            f"(found {sorted(available) or 'none'})"
        )
    autocomplete.check_served(config, source, [model_dir / str(v) for v in served])
    return ModelEntry(config, model_dir, tuple(str(v) for v in served))
