"""The model repository, in Triton's layout.

    <repository>/<model>/config.yaml
    <repository>/<model>/<version>/model.pt | model.pt2 | ...

Loading reads every config and lists the numeric version directories; the version policy
picks the versions served. Nothing here imports a backend: the gateway and the batcher load
the repository without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weir.config import ModelConfig, load_config
from weir.errors import ConfigError, NotFound

CONFIG_FILE = "config.yaml"
PBTXT_FILE = "config.pbtxt"


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
            models[entry.name] = entry
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

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.models.values())


def _load_model(model_dir: Path) -> ModelEntry:
    config_path = model_dir / CONFIG_FILE
    if not config_path.is_file():
        if (model_dir / PBTXT_FILE).is_file():
            raise ConfigError(
                f"{model_dir / PBTXT_FILE}: config.pbtxt is not supported yet; "
                f"write the same fields as {CONFIG_FILE}"
            )
        raise ConfigError(f"{model_dir}: no {CONFIG_FILE}")
    config = load_config(config_path, model_dir.name)
    available = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
    served = config.version_policy.select(available)
    if not served:
        raise ConfigError(
            f"{config_path}: version_policy: no version directory to serve "
            f"(found {sorted(available) or 'none'})"
        )
    return ModelEntry(config, model_dir, tuple(str(v) for v in served))
