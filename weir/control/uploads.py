"""Models loaded from files sent with the load request (Triton's ``file:`` parameters).

A load may carry a model's files instead of naming one in the repository: ``file:1/model.onnx``
and so on, with the model's config. The gateway that takes it checks the paths and the size,
keeps the files in Redis under their digest (every host of the mesh needs them, and Redis is
what they share), and the desired state names the model's directory ``upload:<digest>``.
Each service that reads model files writes them once into its own ``uploads_dir`` (content
addressed, renamed into place whole) before it serves that generation.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path, PurePosixPath

from redis.asyncio import Redis

from weir import names
from weir.control.desired import DesiredModel, DesiredState, as_bytes

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
    if target.is_dir():
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
    if not target.is_dir():
        raw = await redis.hgetall(names.uploaded_files(digest))
        files = {_text(path): as_bytes(data) for path, data in raw.items()}
        write_tree(base, digest, model.name, files)
    return replace(model, path=str(target))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
