"""Reading TorchServe model archives: the manifest, the model config and the files.

An archive comes in one of three formats, told apart by content rather than by name (a
repository holds it as a symlink named ``model.mar``):

- a zip (``torch-model-archiver``'s ``default`` and ``zip-store`` formats, the ``.mar``),
- a gzip'd tar (``--archive-format tgz``), whose members sit under one root directory,
- a directory (``--archive-format no-archive``).

Each holds ``MAR-INF/MANIFEST.json`` at its root. As TorchServe does, a directory or a tar
may instead hold that root one directory down (a tgz unpacked with its root directory).
Member paths are checked before anything is read or written: an absolute path, a ``..``
step or a link in a tar is refused (zip slip).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, Any

import yaml

from weir.errors import ConfigError

MANIFEST_PATH = "MAR-INF/MANIFEST.json"
# The digest prefix that names an unpacked archive in the cache: 128 bits is plenty to tell
# archives apart, and keeps paths short.
_DIGEST_CHARS = 32
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_GZIP_MAGIC = b"\x1f\x8b"

Opener = Callable[[], IO[bytes]]
# What reading a truncated or damaged zip or gzip'd tar raises.
_DAMAGED = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    tarfile.TarError,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
)


class ArchiveError(ConfigError):
    """A TorchServe archive cannot be read; the message names the file."""


class ArchiveFormat(StrEnum):
    """How an archive's files are stored."""

    ZIP = "zip"
    TGZ = "tgz"
    DIRECTORY = "directory"


@dataclass(frozen=True)
class Manifest:
    """An archive's ``MAR-INF/MANIFEST.json``.

    Attributes:
        raw: The whole parsed manifest; handlers get it unchanged as ``context.manifest``.
    """

    raw: dict[str, Any]

    @property
    def _model(self) -> dict[str, Any]:
        model = self.raw.get("model")
        return model if isinstance(model, dict) else {}

    def _optional(self, key: str) -> str | None:
        value = self._model.get(key)
        return str(value) if value not in (None, "") else None

    @property
    def model_name(self) -> str | None:
        """``model.modelName``; TorchServe names a model without one after its file."""
        return self._optional("modelName")

    @property
    def model_version(self) -> str:
        """``model.modelVersion``; ``1.0`` when absent, as TorchServe."""
        return self._optional("modelVersion") or "1.0"

    @property
    def handler(self) -> str:
        """``model.handler``: a file in the archive (``x.py[:fn]``) or a built-in name."""
        return self._optional("handler") or ""

    @property
    def serialized_file(self) -> str | None:
        return self._optional("serializedFile")

    @property
    def model_file(self) -> str | None:
        return self._optional("modelFile")

    @property
    def config_file(self) -> str | None:
        """The archive's ``model-config.yaml``, when it was built with ``--config-file``."""
        return self._optional("configFile")

    @property
    def requirements_file(self) -> str | None:
        return self._optional("requirementsFile")

    @property
    def runtime(self) -> str:
        return str(self.raw.get("runtime") or "python")

    @property
    def archiver_version(self) -> str | None:
        """The ``torch-model-archiver`` version; archives older than 0.2 carry none."""
        value = self.raw.get("archiverVersion")
        return str(value) if value else None


def default_cache_dir() -> Path:
    """Where archives are unpacked unless the caller says otherwise."""
    return Path(tempfile.gettempdir()) / "weir-torchserve"


def detect_format(path: Path) -> ArchiveFormat:
    """Tell an archive's format from its content."""
    if path.is_dir():
        return ArchiveFormat.DIRECTORY
    try:
        with path.open("rb") as file:
            head = file.read(4)
    except OSError as exc:
        raise ArchiveError(f"{path}: cannot read the model archive: {exc.strerror}") from None
    if head.startswith(_ZIP_MAGIC):
        return ArchiveFormat.ZIP
    if head.startswith(_GZIP_MAGIC):
        return ArchiveFormat.TGZ
    raise ArchiveError(
        f"{path}: not a TorchServe model archive (neither a zip .mar, a .tar.gz nor a "
        "directory holding MAR-INF/MANIFEST.json)"
    )


def read_manifest(path: Path) -> Manifest:
    """Read an archive's manifest without unpacking it.

    Raises:
        ArchiveError: The archive is corrupt, unsafe, has no manifest, or the manifest is
            not JSON or names no handler.
    """
    fmt = detect_format(path)
    with _reading(path, fmt):
        if fmt is ArchiveFormat.DIRECTORY:
            data = (_directory_root(path) / MANIFEST_PATH).read_bytes()
        else:
            data = _find_manifest(path, fmt)[1]
    return _parse_manifest(path, data)


def read_model_config(path: Path) -> dict[str, Any]:
    """The archive's ``model-config.yaml`` (manifest ``configFile``); ``{}`` when none."""
    manifest = read_manifest(path)
    if manifest.config_file is None:
        return {}
    data = _read_member(path, manifest.config_file)
    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ArchiveError(f"{path}: {manifest.config_file} is not YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ArchiveError(f"{path}: {manifest.config_file} is not a YAML mapping")
    return config


def extract(path: Path, cache_dir: Path) -> Path:
    """Unpack an archive into ``cache_dir/<sha256[:32]>/`` and return that directory.

    A directory archive is returned as it is. An archive unpacked before is reused. Several
    processes may unpack the same archive at once: each unpacks into a private sibling
    directory and renames it into place; the first rename wins and the others reuse it.

    Raises:
        ArchiveError: The archive is corrupt, unsafe or has no manifest.
    """
    fmt = detect_format(path)
    if fmt is ArchiveFormat.DIRECTORY:
        return _directory_root(path)
    target = cache_dir / _digest(path)[:_DIGEST_CHARS]
    if target.is_dir():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    try:
        with _reading(path, fmt):
            root = _unpack(path, fmt, staging)
        _publish(staging.joinpath(*root.parts), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _publish(unpacked: Path, target: Path) -> None:
    unpacked.chmod(0o755)  # mkdtemp's 0700 would hide it from workers running as other users
    try:
        os.rename(unpacked, target)
    except OSError:
        # Another extractor renamed its copy first; theirs is as good as ours.
        if not target.is_dir():
            raise


def _digest(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@contextmanager
def _reading(path: Path, fmt: ArchiveFormat) -> Iterator[None]:
    """Turn a damaged archive's errors into an :class:`ArchiveError` naming the file."""
    try:
        yield
    except _DAMAGED as exc:
        raise ArchiveError(f"{path}: corrupt model archive ({fmt}): {exc}") from None
    except FileNotFoundError as exc:
        raise ArchiveError(f"{path}: {exc.filename} is missing") from None


def _parse_manifest(path: Path, data: bytes) -> Manifest:
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"{path}: {MANIFEST_PATH} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        raise ArchiveError(f"{path}: {MANIFEST_PATH} has no 'model' entry")
    manifest = Manifest(raw)
    if not manifest.handler:
        raise ArchiveError(f"{path}: {MANIFEST_PATH} names no handler (model.handler)")
    return manifest


def _safe_name(path: Path, name: str) -> PurePosixPath:
    """A member's path, refused when writing it could land outside the unpack directory."""
    member = PurePosixPath(name)
    drive = bool(member.parts) and member.parts[0].endswith(":")
    if member.is_absolute() or ".." in member.parts or "\\" in name or drive:
        raise ArchiveError(f"{path}: unsafe member path {name!r} (outside the archive)")
    parts = [part for part in member.parts if part != "."]
    if not parts:
        raise ArchiveError(f"{path}: member with an empty path {name!r}")
    return PurePosixPath(*parts)


def _manifest_root(name: PurePosixPath) -> PurePosixPath | None:
    """The archive root when ``name`` is its manifest: the top or one directory down."""
    if name.parts[-2:] != ("MAR-INF", "MANIFEST.json") or len(name.parts) > 3:
        return None
    return name.parent.parent


def _directory_root(path: Path) -> Path:
    if (path / MANIFEST_PATH).is_file():
        return path
    children = [child for child in path.iterdir() if not child.name.startswith(".")]
    if len(children) == 1 and (children[0] / MANIFEST_PATH).is_file():
        return children[0]
    raise ArchiveError(f"{path}: no {MANIFEST_PATH} in the model archive directory")


def _find_manifest(path: Path, fmt: ArchiveFormat) -> tuple[PurePosixPath, bytes]:
    """The archive root and the manifest's bytes, in one pass over the members."""
    found: tuple[PurePosixPath, bytes] | None = None
    for name, open_member in _entries(path, fmt):
        root = _manifest_root(name)
        if root is not None and (found is None or len(root.parts) < len(found[0].parts)):
            with open_member() as stream:
                found = (root, stream.read())
    if found is None:
        raise ArchiveError(f"{path}: no {MANIFEST_PATH} in the model archive")
    return found


def _read_member(path: Path, member: str) -> bytes:
    """One file of an archive, by its path relative to the archive root."""
    fmt = detect_format(path)
    relative = _safe_name(path, member)
    with _reading(path, fmt):
        if fmt is ArchiveFormat.DIRECTORY:
            return _directory_root(path).joinpath(*relative.parts).read_bytes()
        wanted = _find_manifest(path, fmt)[0] / relative
        for name, open_member in _entries(path, fmt):
            if name == wanted:
                with open_member() as stream:
                    return stream.read()
    raise ArchiveError(f"{path}: {member} is named in the manifest but not in the archive")


def _entries(path: Path, fmt: ArchiveFormat) -> Iterator[tuple[PurePosixPath, Opener]]:
    """Each file member of a zip or tar, checked, with a function that opens it.

    A member can be opened only before the iteration moves on (a tar is read as a stream).
    """
    return _zip_entries(path) if fmt is ArchiveFormat.ZIP else _tar_entries(path)


def _zip_entries(path: Path) -> Iterator[tuple[PurePosixPath, Opener]]:
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.is_dir():
                yield _safe_name(path, info.filename), partial(archive.open, info)


def _tar_entries(path: Path) -> Iterator[tuple[PurePosixPath, Opener]]:
    # A stream, not a seekable tar: one pass decompresses each byte once.
    with tarfile.open(path, "r|gz") as archive:
        for info in archive:
            if not info.isdir():
                yield _checked_tar_name(path, info), partial(_open_tar, archive, info)


def _checked_tar_name(path: Path, info: tarfile.TarInfo) -> PurePosixPath:
    name = _safe_name(path, info.name)
    if not info.isfile():
        raise ArchiveError(f"{path}: member {info.name!r} is a link or device, not a file")
    return name


def _open_tar(archive: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    stream = archive.extractfile(info)
    return stream if stream is not None else io.BytesIO()


def _unpack(path: Path, fmt: ArchiveFormat, dest: Path) -> PurePosixPath:
    """Write every member under ``dest``; return the root that holds the manifest."""
    roots: list[PurePosixPath] = []
    for name, open_member in _entries(path, fmt):
        target = dest.joinpath(*name.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open_member() as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink)
        root = _manifest_root(name)
        if root is not None:
            roots.append(root)
    if not roots:
        raise ArchiveError(f"{path}: no {MANIFEST_PATH} in the model archive")
    return min(roots, key=lambda root: len(root.parts))
