"""The model repository, in Triton's layout.

    <repository>/<model>/config.yaml          (or Triton's config.pbtxt; YAML wins if both)
    <repository>/<model>/<version>/model.pt | model.pt2 | model.py | ...

Loading reads every config and lists the numeric version directories; the version policy
picks the versions served. An ensemble (a pipeline) may have no version directory at all,
then it serves version ``1``; Triton's empty ``1/`` works too. Once every model is loaded,
each ensemble's step graph is checked against the models it names (:mod:`weir.ensemble`).
Nothing here imports a backend: the gateway and the batcher load the repository without
torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from weir.config import ModelConfig, load_config
from weir.ensemble import check_ensemble
from weir.errors import ConfigError, NotFound

CONFIG_FILE = "config.yaml"
PBTXT_FILE = "config.pbtxt"
# What an ensemble without a version directory serves.
ENSEMBLE_VERSION = 1


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model: its config, its directory and the versions its policy serves."""

    config: ModelConfig
    path: Path
    versions: tuple[str, ...]

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
        """The file the config was read from."""
        yaml_file = self.path / CONFIG_FILE
        return yaml_file if yaml_file.is_file() else self.path / PBTXT_FILE


class Repository:
    """The models found under one directory, by name."""

    def __init__(self, root: Path, models: dict[str, ModelEntry]) -> None:
        self.root = root
        self.models = models

    @classmethod
    def load(cls, root: Path | str) -> Repository:
        root = Path(root).resolve()
        if not root.is_dir():
            raise ConfigError(f"{root}: model repository is not a directory")
        models = {}
        for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            if model_dir.name.startswith("."):
                continue
            entry = _load_model(model_dir)
            _check_inside(root, entry)
            models[entry.name] = entry
        for entry in models.values():
            check_ensemble(entry, models)
        return cls(root, models)

    def resolve(self, name: str, version: str | None = None) -> tuple[ModelEntry, str]:
        """The model and the version to serve; a missing version means the latest served."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"unknown model: '{name}'")
        if not version:
            return entry, entry.latest
        if version not in entry.versions:
            raise NotFound(f"unknown version '{version}' of model '{name}'")
        return entry, version

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self.models.values())


def _check_inside(root: Path, entry: ModelEntry) -> None:
    """Refuse a model or version directory that leads out of the repository (a symlink)."""
    for path in (entry.path, *(entry.version_path(v) for v in entry.versions)):
        if path.exists() and not path.resolve().is_relative_to(root):
            raise ConfigError(f"{path}: leads outside the model repository {root}")


def _load_model(model_dir: Path) -> ModelEntry:
    config_path = model_dir / CONFIG_FILE
    if config_path.is_file():
        config = load_config(config_path, model_dir.name)
    elif (model_dir / PBTXT_FILE).is_file():
        config_path = model_dir / PBTXT_FILE
        # protobuf and tritonclient's messages cost ~20 MB per process: only when needed.
        from weir.pbtxt import load_pbtxt

        config = load_pbtxt(config_path, model_dir.name)
    else:
        raise ConfigError(f"{model_dir}: no {CONFIG_FILE} or {PBTXT_FILE}")
    available = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    if config.is_ensemble and not available:
        available = [ENSEMBLE_VERSION]
    served = config.version_policy.select(available)
    if not served:
        raise ConfigError(
            f"{config_path}: version_policy: no version directory to serve "
            f"(found {sorted(available) or 'none'})"
        )
    return ModelEntry(config, model_dir, tuple(str(v) for v in served))
