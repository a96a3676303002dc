"""A TorchServe model store, served as entries of a generated Triton-layout repository.

Registering an archive of the store writes what Weir's loader reads::

    <repository>/<name>/config.yaml       backend torchserve, batching, instance count
    <repository>/<name>/<n>/model.mar     a symlink to the archive in the store
    <repository>/.torchserve/<name>.json  the bookkeeping TorchServe's API answers from

Each registered TorchServe version string gets a Weir integer version ``n`` (1, 2, ...,
not reused while the model stays registered) and every version is served
(``version_policy: all``). The bookkeeping (:mod:`~weir.torchserve.records`) sits outside
the model directory: a model directory's files are part of every version's reload stamp,
so keeping it there would reload every version on each change.

A version's settings come from the request, the archive, ``config.properties`` and
TorchServe's defaults, in that order (:mod:`~weir.torchserve.version_settings`);
:meth:`ModelStore.scale` changes workers for all versions. Writes hold the bookkeeping's
lock, so several gateway processes may share one store, and change files and directories
by renaming (:mod:`~weir.torchserve.atomic`), so a reader never sees half of one.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from weir.config import InstanceKind
from weir.torchserve.archive import MANIFEST_PATH, ArchiveError, read_manifest, read_model_config
from weir.torchserve.atomic import remove_tree, staging_dir, write_atomic
from weir.torchserve.download import Downloads, fetch, is_url, remove_fetched
from weir.torchserve.properties import ModelVersionSettings
from weir.torchserve.records import (
    BOOK_DIR,
    MODEL_NAME,
    Bookkeeping,
    ModelBook,
    ModelRecord,
    VersionRecord,
)
from weir.torchserve.store_errors import StoreConflict, StoreError, StoreForbidden, StoreNotFound
from weir.torchserve.version_settings import (
    DEFAULT_JOB_QUEUE_SIZE,
    DEFAULT_RESPONSE_TIMEOUT_S,
    DEFAULT_STARTUP_TIMEOUT_S,
    VersionSettings,
    archive_settings,
    device_kind,
    in_force,
    model_config,
    requested,
    resolve,
)

__all__ = [
    "ARCHIVE_SUFFIXES",
    "BOOK_DIR",
    "CONFIG_FILE",
    "DEFAULT_RESPONSE_TIMEOUT_S",
    "DEFAULT_STARTUP_TIMEOUT_S",
    "MODEL_FILE",
    "ModelRecord",
    "ModelStore",
    "Registration",
    "StoreConflict",
    "StoreError",
    "StoreForbidden",
    "StoreNotFound",
    "VersionRecord",
    "default_model_name",
]

MODEL_FILE = "model.mar"
CONFIG_FILE = "config.yaml"
ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".model")


@dataclass(frozen=True)
class Registration:
    """What :meth:`ModelStore.register` did; workers and batching are the model's in force."""

    name: str
    weir_version: str
    ts_version: str
    url: str
    workers: int
    batch_size: int
    max_batch_delay_ms: int


@dataclass(frozen=True)
class _Candidate:
    """An archive about to be registered, and the model version it would make."""

    name: str
    archive: Path
    url: str
    ts_version: str
    runtime: str
    settings: VersionSettings
    kind: InstanceKind


class ModelStore:
    """The archives of ``store_dir`` and the models registered from them in ``repository``."""

    def __init__(
        self, store_dir: Path, repository: Path, downloads: Downloads | None = None
    ) -> None:
        self.store_dir = Path(store_dir).absolute()
        self.repository = Path(repository).absolute()
        self._books = Bookkeeping(self.repository)
        self.downloads = downloads  # None: archives are not fetched by URL

    def archives(self) -> list[str]:
        """The archives in the store (files and ``no-archive`` directories), by name."""
        if not self.store_dir.is_dir():
            return []
        return sorted(p.name for p in self.store_dir.iterdir() if self._is_archive(p))

    def models(self) -> list[str]:
        """The registered model names, sorted."""
        return self._books.names()

    def generation(self) -> int:
        """A number that changes whenever a registration changes (cheap: one stat)."""
        return self._books.generation()

    def describe(self, name: str) -> ModelRecord:
        return self._books.read(name).record()

    def version_for(self, name: str, ts_version: str | None) -> str:
        """The Weir version of ``ts_version``; None: the default version's."""
        return self._books.read(name).version_of(ts_version)

    def ts_version_of(self, name: str, weir_version: str) -> str:
        return self._books.read(name).ts_version_of(weir_version)

    def register(
        self,
        url: str,
        *,
        model_name: str | None = None,
        batch_size: int | None = None,
        max_batch_delay_ms: int | None = None,
        workers: int | None = None,
        response_timeout_s: int | None = None,
        startup_timeout_s: int | None = None,
        default_workers: int | None = None,
        default_response_timeout_s: int = DEFAULT_RESPONSE_TIMEOUT_S,
        default_startup_timeout_s: int = DEFAULT_STARTUP_TIMEOUT_S,
        default_job_queue_size: int = DEFAULT_JOB_QUEUE_SIZE,
        startup: bool = False,
        defaults: ModelVersionSettings | None = None,
    ) -> Registration:
        """Register the archive ``url`` as a model version.

        ``url`` is a name or path inside the store, or an HTTP(S) URL the archive is
        fetched into the store from (:mod:`~weir.torchserve.download`).

        ``defaults``: ``config.properties``' ``models=`` entry for it, below the archive's
        own ``model-config.yaml``; ``default_workers``, ``default_response_timeout_s``
        (``default_response_timeout``), ``default_startup_timeout_s``
        (``default_startup_timeout``) and ``default_job_queue_size`` (``job_queue_size``)
        below all.

        Raises:
            StoreError: The url is not in the store, or the archive or a setting is bad.
            StoreNotFound: No such archive in the store.
            StoreConflict: The model has this version already.
        """
        asked = requested(
            batch_size, max_batch_delay_ms, workers, response_timeout_s, startup_timeout_s
        )
        fallback = ModelVersionSettings(
            response_timeout_s=default_response_timeout_s,
            startup_timeout_s=default_startup_timeout_s,
            job_queue_size=default_job_queue_size,
        )
        layers = (asked, defaults or ModelVersionSettings(), fallback)
        fetching = self.downloads is not None and is_url(url)
        local = fetch(url, self.store_dir, self.downloads) if self.downloads and fetching else url
        try:
            candidate = self._candidate(local, model_name, layers, default_workers or 1)
            if fetching:
                candidate = replace(candidate, url=url)  # listed by the URL it came from
            with self._books.locked():
                record = self._add(candidate, startup)
        except BaseException:
            if fetching:
                (self.store_dir / local).unlink(missing_ok=True)  # the archive it fetched
            raise
        return Registration(
            candidate.name,
            record.weir_version,
            record.ts_version,
            record.url,
            record.min_workers,
            record.batch_size,
            record.max_batch_delay_ms,
        )

    def unregister(self, name: str, ts_version: str | None = None) -> list[str]:
        """Remove one version (None: the default); the last one removes the model.

        Raises:
            StoreNotFound: No such model or version.
            StoreForbidden: It is the default version and other versions remain.
        """
        with self._books.locked():
            book = self._books.read(name)
            weir_version = book.version_of(ts_version)
            if weir_version == book.default and len(book.versions) > 1:
                raise StoreForbidden(f"Cannot remove default version for model {name}")
            if len(book.versions) == 1:
                self._remove_model(name)
            else:
                removed = book.versions.pop(weir_version)
                remove_tree(self.repository / name / weir_version)
                self._books.write(book)
                self._remove_fetched([removed.url])
        return [weir_version]

    def reset(self) -> list[str]:
        """Forget every registered model: its generated directory and its bookkeeping.

        Only models with a book are the store's; any other model directory in the
        repository (a user's own Triton model) is left alone. Returns the names removed.
        """
        if not self._books.directory.is_dir():
            return []  # nothing was ever registered; nothing to create either
        with self._books.locked():
            names = self._books.names()
            for name in names:
                self._remove_model(name)
        return names

    def set_default(self, name: str, ts_version: str) -> str:
        """Make ``ts_version`` the model's default version; returns its Weir version."""
        with self._books.locked():
            book = self._books.read(name)
            weir_version = book.weir_version(ts_version)
            if weir_version is None:
                raise StoreNotFound(f"Model version {ts_version} does not exist for model {name}")
            book.default = weir_version
            self._books.write(book)
        return weir_version

    def scale(self, name: str, workers: int) -> None:
        """Serve every version of ``name`` with ``workers`` instances (1 or more)."""
        if workers < 1:
            raise StoreError(f"workers must be 1 or more, not {workers}")
        with self._books.locked():
            book = self._books.read(name)
            config = self._read_config(name)
            config["instance_group"][0]["count"] = workers
            write_atomic(self.repository / name / CONFIG_FILE, _yaml(config))
            book.set_workers(workers)
            self._books.write(book)

    # -- the store --------------------------------------------------------------------------

    def _is_archive(self, path: Path) -> bool:
        if path.name.startswith(".") or path.absolute() == self.repository:
            return False
        if path.is_dir():
            return (path / MANIFEST_PATH).is_file()
        return path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES)

    def _relative_url(self, url: str) -> str:
        """``url`` as a path relative to the store; anything else is refused."""
        if "://" in url:
            raise StoreError(
                f"Weir does not download model archives ({url}): put the archive in the "
                f"model store {self.store_dir} and register it by its file name"
            )
        if ".." in url:
            raise StoreNotFound(f"Relative path is not allowed in url: {url}")
        path = Path(os.path.normpath(self.store_dir / url))
        if not path.is_relative_to(self.store_dir) or path == self.store_dir:
            raise StoreError(f"{url} is outside the model store {self.store_dir}")
        if path.is_relative_to(self.repository) or not path.exists():
            raise StoreNotFound(f"Model not found at: {url}")
        return path.relative_to(self.store_dir).as_posix()

    def _candidate(
        self,
        url: str,
        model_name: str | None,
        layers: tuple[ModelVersionSettings, ...],
        default_workers: int,
    ) -> _Candidate:
        """What registering ``url`` would add, checked before anything is written."""
        relative = self._relative_url(url)
        archive = self.store_dir / relative
        try:
            manifest, model_yaml = read_manifest(archive), read_model_config(archive)
        except ArchiveError as exc:
            raise StoreError(str(exc)) from None
        name = model_name or manifest.model_name or default_model_name(relative)
        _check_name(name)
        asked, *below = layers  # the archive's own settings come second
        layered = (asked, archive_settings(archive, model_yaml), *below)
        settings, kind = resolve(layered, default_workers), device_kind(model_yaml)
        version, runtime = manifest.model_version, manifest.runtime
        return _Candidate(name, archive, relative, version, runtime, settings, kind)

    # -- the generated repository -----------------------------------------------------------

    def _add(self, candidate: _Candidate, startup: bool) -> VersionRecord:
        name, settings = candidate.name, candidate.settings
        book = self._books.read_or_none(name)
        if book is None:
            book = ModelBook(name, "1", 1, {})
            self._create_model(name, settings, candidate.kind)
        elif book.weir_version(candidate.ts_version) is not None:
            raise StoreConflict(
                f"Model version {candidate.ts_version} is already registered for model {name}"
            )
        else:
            settings = in_force(next(iter(book.versions.values())), settings)
        record = VersionRecord(
            str(book.next_version),
            candidate.ts_version,
            candidate.url,
            **asdict(settings),
            loaded_at_startup=startup,
            runtime=candidate.runtime,
        )
        self._add_version(book, record, candidate.archive)
        return record

    def _create_model(self, name: str, settings: VersionSettings, kind: InstanceKind) -> None:
        model_dir = self.repository / name
        if model_dir.exists():
            raise StoreConflict(f"{model_dir} exists and was not made by the model store")
        self.repository.mkdir(parents=True, exist_ok=True)
        staging = staging_dir(self.repository, name)
        (staging / CONFIG_FILE).write_text(_yaml(model_config(name, settings, kind)))
        os.rename(staging, model_dir)

    def _add_version(self, book: ModelBook, record: VersionRecord, archive: Path) -> None:
        model_dir = self.repository / book.name
        # Built aside and renamed, so the loader never sees a version without its archive.
        staging = staging_dir(model_dir, record.weir_version)
        (staging / MODEL_FILE).symlink_to(archive)
        os.rename(staging, model_dir / record.weir_version)
        book.versions[record.weir_version] = record
        book.next_version += 1
        self._books.write(book)

    def _remove_model(self, name: str) -> None:
        # The directory goes first: a crash between the two leaves a book that a later
        # unregister or reset finishes, never a directory no book claims.
        book = self._books.read_or_none(name)
        remove_tree(self.repository / name)
        self._books.remove(name)
        self._remove_fetched([v.url for v in book.versions.values()] if book else [])

    def _remove_fetched(self, urls: list[str]) -> None:
        """Remove the archives fetched for these URLs, unless a registration still uses one."""
        if any(is_url(url) for url in urls):
            used = {
                v.url for n in self._books.names() for v in self._books.read(n).versions.values()
            }
            remove_fetched(self.store_dir, urls, used)

    def _read_config(self, name: str) -> dict[str, Any]:
        path = self.repository / name / CONFIG_FILE
        try:
            config = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise StoreError(f"{path}: cannot read the generated config: {exc}") from None
        if not isinstance(config, dict) or not config.get("instance_group"):
            raise StoreError(f"{path}: not a config the model store wrote")
        return config


def default_model_name(url: str) -> str:
    """TorchServe's name for a model whose archive names none: its file name, cleaned."""
    base = url.rsplit("/", 1)[-1]
    for suffix in ARCHIVE_SUFFIXES:
        base = base.removesuffix(suffix)
    return re.sub(r"\W|^_", "_", base)


def _check_name(name: str) -> None:
    if not MODEL_NAME.fullmatch(name):
        raise StoreError(
            f"Invalid model name {name!r}: use letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )


def _yaml(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, sort_keys=False)
