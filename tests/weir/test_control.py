"""The desired state and its writers, against a real redis-server: compare-and-set, stamps, poll.

The control plane's keys have fixed names, so each test has a Redis database of its own
(flushed before and after), apart from the session mesh's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import textwrap
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.sleeper import ECHO
from weir import names
from weir.completion import Completion
from weir.control.controller import Controller
from weir.control.desired import DesiredModel, DesiredState, DesiredStore
from weir.control.resolve import parse_weights, resolve
from weir.errors import ConfigError
from weir.redis_server import RedisServer
from weir.workload import MeshView

CONTROL_DB = 9


@pytest.fixture
def control_url(redis_server: RedisServer) -> str:
    return redis_server.url.rsplit("/", 1)[0] + f"/{CONTROL_DB}"


@pytest.fixture
async def redis(control_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(control_url)
    await client.flushdb()
    yield client
    await client.flushdb()
    await client.aclose()


def model(name: str, versions: tuple[str, ...] = ("1",)) -> DesiredModel:
    config = {"name": name, "backend": "python", "input": [{"name": "X", "dims": [2]}]}
    stamps = {v: f"stamp-{name}-{v}" for v in versions}
    return DesiredModel(name, f"/models/{name}", config, versions, stamps)


def adding(name: str) -> Callable[[DesiredState], DesiredState]:
    return lambda state: state.with_model(model(name))


def write_python_model(root: Path, name: str, versions: tuple[str, ...], policy: str = "") -> None:
    config = f"""
        name: {name}
        backend: python
        max_batch_size: 4
        input: [{{name: X, data_type: TYPE_FP32, dims: [2]}}]
        output: [{{name: Y, data_type: TYPE_FP32, dims: [2]}}]
        {policy}
    """
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.yaml").write_text(textwrap.dedent(config))
    for version in versions:
        add_version(root, name, version)


def add_version(root: Path, name: str, version: str) -> None:
    (root / name / version).mkdir()
    (root / name / version / "model.py").write_text(ECHO)


def touch_later(path: Path) -> None:
    """A new modification time (one second on), as an edit or a copy over the file gives."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def run_in_another_thread(coroutine: Coroutine[Any, Any, Any]) -> None:
    """Run ``coroutine`` to its end on an event loop of its own, blocking this one meanwhile."""
    thread = threading.Thread(target=asyncio.run, args=(coroutine,))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()


# --- DesiredState and DesiredStore ------------------------------------------------------------


def test_a_desired_state_survives_encode_and_decode_unchanged() -> None:
    weighted = DesiredModel(
        "tiny",
        "/models/tiny",
        {"name": "tiny", "max_batch_size": 8, "instance_group": [{"count": 2}]},
        ("1", "3"),
        {"1": "aaaa", "3": "bbbb"},
        {"1": 20, "3": 80},
    )
    state = DesiredState(7, {"tiny": weighted, "echo": model("echo")}, {"gone": "unloaded"})

    decoded = DesiredState.decode(state.encode())

    assert decoded == state
    assert decoded.models["tiny"].versions == ("1", "3")
    assert decoded.models["tiny"].weights == {"1": 20, "3": 80}


async def test_an_update_that_lost_a_race_is_applied_again_to_the_winners_state(
    redis: Redis, control_url: str
) -> None:
    store = DesiredStore(redis)
    seen: list[list[str]] = []

    async def other_writer() -> None:
        client = Redis.from_url(control_url)
        try:
            await DesiredStore(client).update(adding("b"))
        finally:
            await client.aclose()

    def add_a(state: DesiredState) -> DesiredState:
        seen.append(sorted(state.models))
        if len(seen) == 1:  # another writer commits between this one's read and its write
            run_in_another_thread(other_writer())
        return state.with_model(model("a"))

    result = await store.update(add_a)

    assert seen == [[], ["b"]]
    assert sorted(result.models) == ["a", "b"]
    assert result.generation == 2
    assert await store.read() == result
    assert await store.generation() == 2


async def test_concurrent_updates_all_land_each_moving_the_generation_once(
    redis: Redis, control_url: str
) -> None:
    clients = [Redis.from_url(control_url) for _ in range(6)]
    try:
        await asyncio.gather(
            *(DesiredStore(c).update(adding(f"m{i}")) for i, c in enumerate(clients))
        )
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))

    state = await DesiredStore(redis).read()
    assert state is not None
    assert sorted(state.models) == [f"m{i}" for i in range(6)]
    assert state.generation == 6


async def test_an_update_that_changes_nothing_keeps_the_generation(redis: Redis) -> None:
    store = DesiredStore(redis)
    first = await store.update(adding("a"))

    same = await store.update(lambda state: state)
    again = await store.update(adding("a"))  # the very model it already holds

    assert first.generation == same.generation == again.generation == 1
    assert await store.generation() == 1
    assert await store.read() == first


# --- resolve and parse_weights ----------------------------------------------------------------


def test_a_versions_stamp_changes_with_its_files_and_only_then(tmp_path: Path) -> None:
    write_python_model(tmp_path, "echo", ("1", "2"), policy="version_policy: {all: {}}")
    before = resolve(tmp_path, "echo", Completion())

    assert resolve(tmp_path, "echo", Completion()).stamps == before.stamps
    touch_later(tmp_path / "echo" / "2" / "model.py")
    after = resolve(tmp_path, "echo", Completion())

    assert before.versions == after.versions == ("1", "2")
    assert after.stamps["1"] == before.stamps["1"]
    assert after.stamps["2"] != before.stamps["2"]


def test_a_change_of_the_config_file_changes_every_versions_stamp(tmp_path: Path) -> None:
    write_python_model(tmp_path, "echo", ("1", "2"), policy="version_policy: {all: {}}")
    before = resolve(tmp_path, "echo", Completion())

    touch_later(tmp_path / "echo" / "config.yaml")
    after = resolve(tmp_path, "echo", Completion())

    assert all(after.stamps[v] != before.stamps[v] for v in ("1", "2"))


def test_weights_parse_as_version_colon_weight() -> None:
    assert parse_weights(" 1:80, 2:20 ", ("1", "2"), "m") == {"1": 80, "2": 20}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1:80,2", "traffic_split '1:80,2': write version:weight, ..."),
        ("1:-5", "traffic_split '1:-5': write version:weight, ..."),
        ("1:x", "traffic_split '1:x': write version:weight, ..."),
        ("3:10", "traffic weights name versions 3, which are not served (served: 1, 2)"),
        ("1:0,2:0", "traffic weights must be >= 0, one of them > 0"),
    ],
)
def test_weights_that_cannot_be_served_are_refused_naming_the_model(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_weights(text, ("1", "2"), "m")

    assert str(caught.value) == f"model 'm': {message}"


# --- Controller.poll_once ---------------------------------------------------------------------


async def serving(redis: Redis, model_name: str) -> set[str]:
    return {v.decode() for v in await redis.smembers(names.serving_versions(model_name))}


async def test_poll_serves_a_new_version_directory_in_place_of_the_old(
    redis: Redis, tmp_path: Path
) -> None:
    write_python_model(tmp_path, "echo", ("1",))
    controller = Controller(redis, tmp_path, Completion(), settle_s=0)
    first = await controller.poll_once()
    assert first.models["echo"].versions == ("1",)
    assert await serving(redis, "echo") == {"1"}

    add_version(tmp_path, "echo", "2")
    state = await controller.poll_once()

    assert state.models["echo"].versions == ("2",)
    assert state.generation == first.generation + 1
    # The new version admits requests at once; the old one until its successor is served.
    assert await serving(redis, "echo") == {"1", "2"}


async def test_poll_of_an_unchanged_repository_keeps_the_generation(
    redis: Redis, tmp_path: Path
) -> None:
    write_python_model(tmp_path, "echo", ("1",))
    controller = Controller(redis, tmp_path, Completion(), settle_s=0)
    first = await controller.poll_once()

    again = await controller.poll_once()

    assert again == first


async def test_poll_stops_serving_a_removed_model_and_says_why(
    redis: Redis, tmp_path: Path
) -> None:
    write_python_model(tmp_path, "echo", ("1",))
    write_python_model(tmp_path, "other", ("1",))
    controller = Controller(redis, tmp_path, Completion(), settle_s=0)
    await controller.poll_once()

    shutil.rmtree(tmp_path / "echo")
    state = await controller.poll_once()

    assert sorted(state.models) == ["other"]
    assert state.reasons == {"echo": "unloaded"}
    assert await serving(redis, "echo") == set()
    assert await serving(redis, "other") == {"1"}


async def test_poll_keeps_why_a_broken_model_is_not_served_and_serves_the_rest(
    redis: Redis, tmp_path: Path
) -> None:
    write_python_model(tmp_path, "echo", ("1",))
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "config.yaml").write_text("backend: python\nmax_batch_size: [8]\n")
    controller = Controller(redis, tmp_path, Completion(), settle_s=0)

    state = await controller.poll_once()

    assert sorted(state.models) == ["echo"]
    reason = state.reasons["broken"]
    assert reason.startswith(f"load failed: {tmp_path / 'broken' / 'config.yaml'}: ")
    assert "max_batch_size" in reason


async def test_a_model_a_stale_settle_reopened_after_its_unload_is_closed_next_round(
    redis: Redis, tmp_path: Path
) -> None:
    # A control round settles the state it read at its start: one read before an unload
    # may reopen the model's versions after the unload closed them. With nothing left to
    # close them, its lanes could not retire (they wait for the model to admit nothing).
    controller = Controller(redis, tmp_path, Completion(), settle_s=0)
    before = DesiredState().with_model(model("kept")).with_model(model("gone"))
    after = DesiredState().with_model(model("kept"))
    await controller.settle(before, MeshView())
    assert await serving(redis, "gone") == {"1"}

    await redis.delete(names.serving_versions("gone"))  # the unload closes it
    await controller.settle(before, MeshView())  # a round that read the state before it
    assert await serving(redis, "gone") == {"1"}  # reopened

    await controller.settle(after, MeshView())  # the next round
    assert await serving(redis, "gone") == set()
    assert await serving(redis, "kept") == {"1"}
