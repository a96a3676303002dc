"""The files of uploaded models leave each host once no process there holds them.

Real directories and a real Redis; a lease's age is set with ``os.utime`` rather than waited.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from weir import names
from weir.control import uploads
from weir.control.desired import DesiredModel, DesiredState
from weir.redis_server import RedisServer

KEEP_S = 60.0
FILES = {"1/model.onnx": b"weights", "config.pbtxt": b"name: 'm'"}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


def state(*digests: str) -> DesiredState:
    models = {
        f"m{i}": DesiredModel(f"m{i}", uploads.UPLOAD_PREFIX + d, {}, ("1",), {"1": "s"})
        for i, d in enumerate(digests)
    }
    return DesiredState(generation=len(digests), models=models)


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_prune_takes_only_what_is_unheld_and_past_its_lease(tmp_path: Path) -> None:
    for digest in ("held", "fresh", "stale"):
        uploads.write_tree(tmp_path, digest, "m", FILES)
    (tmp_path / ".stale.0123").mkdir()  # staging of a writer that died
    (tmp_path / ".fresh.4567").mkdir()  # staging being written
    for path in ("held", "stale", ".stale.0123"):
        age(tmp_path / path, 2 * KEEP_S)

    removed = uploads.prune(tmp_path, {"held"}, KEEP_S)

    assert sorted(removed) == [".stale.0123", "stale"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [".fresh.4567", ".lock", "fresh", "held"]
    assert (tmp_path / "held" / "m" / "1" / "model.onnx").read_bytes() == b"weights"


def test_writing_files_already_here_renews_their_lease(tmp_path: Path) -> None:
    uploads.write_tree(tmp_path, "d", "m", FILES)
    age(tmp_path / "d", 2 * KEEP_S)
    uploads.write_tree(tmp_path, "d", "m", {"1/model.onnx": b"not written again"})
    assert uploads.prune(tmp_path, set(), KEEP_S) == []
    assert (tmp_path / "d" / "m" / "1" / "model.onnx").read_bytes() == b"weights"


async def test_a_process_holds_what_its_state_names_and_lets_go_keep_s_after(
    tmp_path: Path, redis_url: str
) -> None:
    redis = Redis.from_url(redis_url)
    try:
        for digest in ("a", "b"):
            await redis.hset(names.uploaded_files(digest), mapping=FILES)  # type: ignore[arg-type]
        files = uploads.LocalFiles(redis, tmp_path, KEEP_S)
        served = await files.localize(state("a", "b"))
        assert {m.path for m in served.models.values()} == {
            str(tmp_path / d / f"m{i}") for i, d in enumerate(("a", "b"))
        }
        assert (tmp_path / "b" / "m1" / "config.pbtxt").read_bytes() == b"name: 'm'"

        # b leaves the state: its lease starts again then, so it outlives the state by keep_s.
        age(tmp_path / "b", 2 * KEEP_S)
        await files.localize(state("a"))
        await files.tidy()
        assert (tmp_path / "b").is_dir()

        # Past keep_s since it left, b goes; a, still named, stays however old its lease was.
        age(tmp_path / "a", 2 * KEEP_S)
        age(tmp_path / "b", 2 * KEEP_S)
        files.next_tidy_s = 0.0  # tidy runs a few times per keep_s: this is the next one
        await files.tidy()
        assert sorted(e.name for e in os.scandir(tmp_path) if e.is_dir()) == ["a"]
    finally:
        await redis.aclose()


async def test_files_another_process_of_the_host_holds_are_kept(
    tmp_path: Path, redis_url: str
) -> None:
    redis = Redis.from_url(redis_url)
    try:
        await redis.hset(names.uploaded_files("shared"), mapping=FILES)  # type: ignore[arg-type]
        holder = uploads.LocalFiles(redis, tmp_path, KEEP_S)  # e.g. another mesh's worker
        other = uploads.LocalFiles(redis, tmp_path, KEEP_S)  # its state names nothing
        await holder.localize(state("shared"))
        age(tmp_path / "shared", 2 * KEEP_S)

        await holder.tidy()  # renews what it holds
        await other.tidy()
        assert (tmp_path / "shared" / "m0" / "1" / "model.onnx").read_bytes() == b"weights"

        # Once the holder stops renewing (it stopped, or let go) for keep_s, the files go.
        age(tmp_path / "shared", 2 * KEEP_S)
        other.next_tidy_s = 0.0
        await other.tidy()
        assert not (tmp_path / "shared").exists()
    finally:
        await redis.aclose()
