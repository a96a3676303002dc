"""The model store's bookkeeping: each registered model's versions and their settings.

One JSON file per model, ``<repository>/.torchserve/<name>.json``, is what TorchServe's
management API answers from; a model is registered exactly when its file exists. Files
are replaced by renaming, and writers hold a ``flock`` on ``<repository>/.torchserve/lock``
so several gateway processes may share one store.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from weir.torchserve.atomic import write_atomic
from weir.torchserve.store_errors import StoreError, StoreNotFound

BOOK_DIR = ".torchserve"
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_LOCK_FILE = "lock"


@dataclass(frozen=True)
class VersionRecord:
    """One registered version and the settings in force for it."""

    weir_version: str
    ts_version: str
    url: str
    batch_size: int
    max_batch_delay_ms: int
    min_workers: int
    max_workers: int
    response_timeout_s: int
    loaded_at_startup: bool
    runtime: str
    # TorchServe's default: what a book written before the startup timeout was kept reads as.
    startup_timeout_s: int = 120
    job_queue_size: int = 100
    client_timeout_ms: int = 0
    is_default: bool = False


@dataclass(frozen=True)
class ModelRecord:
    """A registered model and its versions, by Weir version, ascending."""

    name: str
    versions: list[VersionRecord]

    @property
    def default(self) -> VersionRecord:
        return next(v for v in self.versions if v.is_default)

    @property
    def default_url(self) -> str:
        return self.default.url


@dataclass
class ModelBook:
    """A model's bookkeeping: its default and next Weir version, and each version."""

    name: str
    default: str
    next_version: int
    versions: dict[str, VersionRecord]

    def weir_version(self, ts_version: str) -> str | None:
        return next((w for w, v in self.versions.items() if v.ts_version == ts_version), None)

    def version_of(self, ts_version: str | None) -> str:
        """The Weir version of ``ts_version``; None: the default version.

        Raises:
            StoreNotFound: The model has no such version.
        """
        if ts_version is None:
            return self.default
        found = self.weir_version(ts_version)
        if found is None:
            raise StoreNotFound(
                f"Model version: {ts_version} does not exist for model: {self.name}"
            )
        return found

    def ts_version_of(self, weir_version: str) -> str:
        """The TorchServe version string of ``weir_version``.

        Raises:
            StoreNotFound: The model has no such version.
        """
        record = self.versions.get(weir_version)
        if record is None:
            raise StoreNotFound(
                f"Model version: {weir_version} does not exist for model: {self.name}"
            )
        return record.ts_version

    def set_workers(self, workers: int) -> None:
        """Record every version as served by ``workers`` instances."""
        self.versions = {
            w: replace(v, min_workers=workers, max_workers=workers)
            for w, v in self.versions.items()
        }

    def record(self) -> ModelRecord:
        """The model as the management API describes it, the default version marked."""
        ordered = sorted(self.versions, key=int)
        marked = [replace(self.versions[w], is_default=w == self.default) for w in ordered]
        return ModelRecord(self.name, marked)


class Bookkeeping:
    """The books of the models registered in ``repository``, and the lock writers hold."""

    def __init__(self, repository: Path) -> None:
        self.directory = repository / BOOK_DIR
        self._directory = str(self.directory)  # stat'ed per prediction: no Path on the way

    def generation(self) -> int:
        """Changes whenever a book is written or removed (each is a rename in the directory)."""
        try:
            return os.stat(self._directory).st_mtime_ns
        except FileNotFoundError:
            return 0

    def names(self) -> list[str]:
        """The registered model names, sorted."""
        if not self.directory.is_dir():
            return []
        stems = (p.stem for p in self.directory.glob("*.json") if not p.name.startswith("."))
        return sorted(name for name in stems if MODEL_NAME.fullmatch(name))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock, shared by every process writing to this repository."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / _LOCK_FILE).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read_or_none(self, name: str) -> ModelBook | None:
        return self.read(name) if self._path(name).is_file() else None

    def read(self, name: str) -> ModelBook:
        """``name``'s book.

        Raises:
            StoreNotFound: ``name`` is not registered.
            StoreError: Its book cannot be read.
        """
        path = self._path(name)
        # The name may come from a request path: checked before it makes a file name.
        if not MODEL_NAME.fullmatch(name) or not path.is_file():
            raise StoreNotFound(f"Model not found: {name}")
        try:
            raw = json.loads(path.read_text())
            versions = {w: VersionRecord(**v) for w, v in raw["versions"].items()}
            return ModelBook(raw["name"], raw["default"], int(raw["next_version"]), versions)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{path}: unreadable model store bookkeeping: {exc}") from None

    def write(self, book: ModelBook) -> None:
        raw = {
            "name": book.name,
            "default": book.default,
            "next_version": book.next_version,
            "versions": {w: _stored(v) for w, v in book.versions.items()},
        }
        write_atomic(self._path(book.name), json.dumps(raw, indent=2) + "\n")

    def remove(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.json"


def _stored(record: VersionRecord) -> dict[str, Any]:
    # Which version is the default is the book's to say, not each record's.
    return {f.name: getattr(record, f.name) for f in fields(record) if f.name != "is_default"}
