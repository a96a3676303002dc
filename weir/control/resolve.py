"""From the repository's files to desired models: read, complete, check, stamp.

A stamp identifies what a version's lane would load: the completed config, the files beside
the version directories (labels, a shared ``model.py``) and the version directory's files,
by path, size and modification time (Triton's poll mode also watches modification times).
Reading stats only, a poll of an unchanged repository reads no config and no model file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from weir.completion import Completion
from weir.control.desired import DesiredModel
from weir.errors import ConfigError
from weir.repository import ModelEntry, load_model

SKIPPED_DIRS = frozenset({"__pycache__"})


def resolve(
    root: Path,
    name: str,
    completion: Completion,
    override: dict[str, Any] | None = None,
    weights: dict[str, int] | None = None,
) -> DesiredModel:
    """Model ``name`` of the repository at ``root`` as the mesh should serve it.

    ConfigError for anything wrong with it, naming the file and the field.
    """
    entry = load_model(root, name, completion, override)
    config = entry.config.model_dump(mode="json", exclude_defaults=True)
    config["backend"] = entry.config.backend.value
    config_hash = _digest(json.dumps(config, sort_keys=True).encode(), files_signature(entry.path))
    stamps = {
        v: _digest(config_hash.encode(), _tree_signature(entry.version_path(v)))
        for v in entry.versions
    }
    return DesiredModel(
        name, str(entry.path), config, entry.versions, stamps, weights or split_weights(entry)
    )


def steps_of(model: DesiredModel) -> list[str]:
    """The models a pipeline's steps name (none for a model that is no pipeline)."""
    scheduling = model.config.get("ensemble_scheduling") or {}
    return sorted({str(step["model_name"]) for step in scheduling.get("step", ())})


def files_signature(model_dir: Path) -> bytes:
    """The model directory's own files (not its version directories), by stat."""
    parts = []
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            parts.append(_stat_line(path, model_dir))
        elif path.is_dir() and not path.name.isdigit() and path.name not in SKIPPED_DIRS:
            parts.append(_tree_signature(path))
    return b"".join(parts)


def model_signature(model_dir: Path) -> str:
    """Every file of a model directory by stat: what a poll compares to see a change."""
    return _digest(_tree_signature(model_dir))


def _tree_signature(directory: Path) -> bytes:
    return b"".join(_stat_line(path, directory) for path in _files(directory))


def _files(directory: Path) -> Iterator[Path]:
    if not directory.is_dir():
        return
    for path in sorted(directory.iterdir()):
        if path.is_dir():
            if path.name not in SKIPPED_DIRS:
                yield path
                yield from _files(path)
        else:
            yield path


def _stat_line(path: Path, base: Path) -> bytes:
    try:
        stat = path.stat()
    except OSError:
        return f"{path.relative_to(base)}:gone\n".encode()
    size = 0 if path.is_dir() else stat.st_size
    return f"{path.relative_to(base)}:{size}:{stat.st_mtime_ns}\n".encode()


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


WEIGHTS_PARAMETER = "traffic_split"


def split_weights(entry: ModelEntry) -> dict[str, int]:
    """The config's traffic split, ``parameters { traffic_split: "1:80,2:20" }``."""
    text = entry.config.parameters.get(WEIGHTS_PARAMETER, "").strip()
    return parse_weights(text, entry.versions, entry.name) if text else {}


def parse_weights(text: str, versions: tuple[str, ...], model: str) -> dict[str, int]:
    """``"1:80,2:20"`` as weights by version; ConfigError for a version not served."""
    weights: dict[str, int] = {}
    for item in text.split(","):
        version, _, weight = item.strip().partition(":")
        if not weight.strip().isdigit():
            raise ConfigError(
                f"model '{model}': {WEIGHTS_PARAMETER} {text!r}: write version:weight, ..."
            )
        weights[version.strip()] = int(weight)
    return check_weights(weights, versions, model)


def check_weights(weights: dict[str, int], versions: tuple[str, ...], model: str) -> dict[str, int]:
    unknown = sorted(set(weights) - set(versions))
    if unknown:
        raise ConfigError(
            f"model '{model}': traffic weights name versions {', '.join(unknown)}, which are "
            f"not served (served: {', '.join(versions)})"
        )
    if any(w < 0 for w in weights.values()) or not any(weights.values()):
        raise ConfigError(f"model '{model}': traffic weights must be >= 0, one of them > 0")
    return weights
