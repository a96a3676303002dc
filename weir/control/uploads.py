"""Models loaded from files sent with the load request (Triton's ``file:`` parameters).

A load may carry a model's files instead of naming one in the repository: ``file:1/model.onnx``
and so on, with the model's config. The gateway that takes it checks the paths and the size,
keeps the files in Redis under their digest (every host of the mesh needs them, and Redis is
what they share), and the desired state names the model's directory ``upload:<digest>``.
Each service that reads model files writes them once into its own ``uploads_dir`` (content
addressed, renamed into place whole) before it serves that generation.

Files no model uses any more leave each host too (:class:`LocalFiles`). Every Weir process of
a host may share the directory (the default is the same for all, whichever mesh they serve),
so a directory's modification time is a lease: each process renews those its state names a
few times per ``keep_s``, and those its state just stopped naming once more; a directory whose
lease is older than ``keep_s`` is no process's and is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path, PurePosixPath

from redis.asyncio import Redis

from weir import names
from weir.control.desired import DesiredModel, DesiredState, as_bytes

logger = logging.getLogger(__name__)

UPLOAD_PREFIX = "upload:"
FILE_PARAMETER = "file:"


def default_dir() -> Path:
    return Path(tempfile.gettempdir()) / "weir-uploads"


def check_files(name: str, files: dict[str, bytes], limit_bytes: int) -> None:
    """ValueError unless every path stays in the model directory and all fit the limit."""
    if limit_bytes <= 0:
        raise ValueError("loading model files sent with the request is turned off")
    total = sum(len(data) for data in files.values())
    if total > limit_bytes:
        raise ValueError(f"the model files sent ({total} bytes) exceed the limit of {limit_bytes}")
    for path in files:
        parts = PurePosixPath(path).parts
        if not parts or path.startswith("/") or ".." in parts or "\\" in path:
            raise ValueError(f"'{FILE_PARAMETER}{path}' must be a path inside the model directory")
    if not any(
        PurePosixPath(p).parts[0].isdigit() and len(PurePosixPath(p).parts) > 1 for p in files
    ):
        raise ValueError(
            f"model '{name}': no file in a version directory (e.g. 'file:1/model.onnx')"
        )


def digest_of(name: str, config: bytes, files: dict[str, bytes]) -> str:
    hashed = hashlib.sha256(name.encode() + b"\0" + config)
    for path in sorted(files):
        hashed.update(b"\0" + path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return hashed.hexdigest()[:24]


def model_dir(base: Path, digest: str, name: str) -> Path:
    return base / digest / name


def write_tree(base: Path, digest: str, name: str, files: dict[str, bytes]) -> Path:
    """The files under ``base/<digest>/<name>``, written aside and renamed into place."""
    target = model_dir(base, digest, name)
    with _locked(base, fcntl.LOCK_SH):
        if _renewed(base, digest, name):  # another load of the same files
            return target
        staging = base / f".{digest}.{uuid.uuid4().hex}"
        for path, data in files.items():
            file = staging / name / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data)
        try:
            os.replace(staging, base / digest)
        except OSError:  # another process of this host wrote it first
            shutil.rmtree(staging, ignore_errors=True)
    return target


def claim(base: Path, digest: str, name: str) -> bool:
    """Whether the files are here; when they are, their lease starts again.

    Under the lock, so no prune takes them from under the caller.
    """
    with _locked(base, fcntl.LOCK_SH):
        return _renewed(base, digest, name)


def _renewed(base: Path, digest: str, name: str) -> bool:
    if not model_dir(base, digest, name).is_dir():
        return False
    renew(base, {digest})
    return True


@contextlib.contextmanager
def _locked(base: Path, operation: int) -> Iterator[None]:
    """``flock`` on ``base/.lock``, which every process of the host takes.

    Shared while files are looked up or written, exclusive while a prune decides and removes.
    """
    base.mkdir(parents=True, exist_ok=True)
    fd = os.open(base / ".lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, operation)
        yield
    finally:
        os.close(fd)


async def store(redis: Redis, digest: str, files: dict[str, bytes]) -> None:
    await redis.hset(names.uploaded_files(digest), mapping=files)  # type: ignore[arg-type]


async def localize(redis: Redis, state: DesiredState, base: Path) -> DesiredState:
    """``state`` with each uploaded model's directory a local one, written if missing."""
    models = dict(state.models)
    for model in state.models.values():
        if model.path.startswith(UPLOAD_PREFIX):
            models[model.name] = await _localized(redis, model, base)
    return replace(state, models=models)


async def _localized(redis: Redis, model: DesiredModel, base: Path) -> DesiredModel:
    digest = model.path.removeprefix(UPLOAD_PREFIX)
    target = model_dir(base, digest, model.name)
    # In a thread: the lock waits out another process's prune, the writes take their time.
    if not await asyncio.to_thread(claim, base, digest, model.name):
        raw = await redis.hgetall(names.uploaded_files(digest))
        files = {_text(path): as_bytes(data) for path, data in raw.items()}
        await asyncio.to_thread(write_tree, base, digest, model.name, files)
    return replace(model, path=str(target))


def digests(state: DesiredState) -> set[str]:
    """The uploads ``state``'s models are served from."""
    return {
        m.path.removeprefix(UPLOAD_PREFIX)
        for m in state.models.values()
        if m.path.startswith(UPLOAD_PREFIX)
    }


def renew(base: Path, names_: set[str], now_s: float | None = None) -> None:
    """Renew the lease of each directory ``names_`` names under ``base``.

    One missing, or another user's, is left as it is.
    """
    for name in names_:
        with contextlib.suppress(OSError):
            os.utime(base / name, (now_s, now_s) if now_s is not None else None)


def prune(base: Path, keep: set[str], keep_s: float, now_s: float | None = None) -> list[str]:
    """Remove what no process holds; the names removed.

    That is every directory under ``base`` that ``keep`` does not name and whose lease is older
    than ``keep_s``, staging left by a writer that died included.
    """
    removed: list[str] = []
    try:
        with _locked(base, fcntl.LOCK_EX):
            now_s = time.time() if now_s is None else now_s
            for entry in os.scandir(base):
                if _stale(entry, keep, keep_s, now_s):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.name)
    except OSError:  # not ours to read or lock (another user's directory)
        pass
    return removed


def _stale(entry: os.DirEntry[str], keep: set[str], keep_s: float, now_s: float) -> bool:
    if entry.name in keep or not entry.is_dir(follow_symlinks=False):
        return False
    try:
        return now_s - entry.stat(follow_symlinks=False).st_mtime > keep_s
    except OSError:
        return False


class LocalFiles:
    """One process's share of its host's uploaded files.

    They are written when its desired state names them, leased while it does and ``keep_s``
    after, and removed when no process holds them.
    """

    def __init__(self, redis: Redis, base: Path, keep_s: float) -> None:
        self.redis, self.base, self.keep_s = redis, base, keep_s
        self.used: set[str] = set()
        self.next_tidy_s = 0.0

    async def localize(self, state: DesiredState) -> DesiredState:
        """``state`` with its uploads written here (see :func:`localize`), their leases renewed."""
        localized = await localize(self.redis, state, self.base)
        used = digests(state)
        left, self.used = self.used - used, used
        await asyncio.to_thread(renew, self.base, used | left)
        return localized

    async def tidy(self) -> None:
        """Renew this process's leases and remove what nobody holds, a few times per keep_s."""
        now = time.monotonic()
        if now < self.next_tidy_s:
            return
        self.next_tidy_s = now + self.keep_s / 4
        removed = await asyncio.to_thread(self._tidy)
        if removed:
            logger.info("removed the files of uploads no model uses: %s", ", ".join(removed))

    def _tidy(self) -> list[str]:
        renew(self.base, self.used)
        return prune(self.base, self.used, self.keep_s)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
