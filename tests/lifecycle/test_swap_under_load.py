"""Changing what a running mesh serves fails no request (mode poll, 30 clients throughout).

While 30 clients keep calling model ``a`` (naming no version): model ``b`` appears in the
repository and is served, then disappears and is unloaded; version 2 of ``a`` appears and
``a``'s answers move to it; ``a``'s ``instance_group.count`` changes. Not one request of
``a`` may fail, every answer must be the one the version that gave it computes, and the
server stays ready throughout (a load balancer never takes it out).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import private_mesh, wait_until
from tests.lifecycle.helpers import Load, add_version, mlp_config, write_config

POLL_S = 2.0
SETTLE_S = 3.0  # after version 2 is served, version 1 closes within a few refresh periods


def index(url: str) -> dict[str, dict[str, str]]:
    models = httpx.post(f"{url}/v2/repository/index", timeout=10).json()
    return {f"{m['name']}:{m.get('version', '')}": m for m in models}


async def until(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """conftest's wait_until, off the event loop the load runs on."""
    await asyncio.to_thread(wait_until, condition, timeout_s, what)


def ready(url: str, key: str) -> bool:
    return index(url).get(key, {}).get("state") == "READY"


def instance_count(url: str, model: str) -> int:
    config = httpx.get(f"{url}/v2/models/{model}/config", timeout=10).json()
    return int(sum(group["count"] for group in config["instance_group"]))


async def changes(url: str, repository: Path, load: Load) -> dict[str, float]:
    """Add and remove b, add a's version 2, change a's instances; when each was done."""
    marks: dict[str, float] = {}
    await load.more(200)  # the load runs on version 1 for a while first
    write_config(repository / "b", mlp_config("b"))
    add_version(repository / "b", 1)
    await until(lambda: ready(url, "b:1"), 30, "b to be served")
    shutil.rmtree(repository / "b")
    await until(lambda: "b:1" not in index(url), 30, "b to be unloaded")
    marks["v2_added"] = time.monotonic()
    add_version(repository / "a", 2)
    await until(lambda: ready(url, "a:2"), 30, "a:2 to be served")
    marks["v2_ready"] = time.monotonic()
    await load.more(300)
    write_config(
        repository / "a", mlp_config("a", instance_group=[{"kind": "KIND_CPU", "count": 2}])
    )
    await until(lambda: instance_count(url, "a") == 2, 30, "a's new config")
    await until(lambda: ready(url, "a:2"), 30, "a:2 with two instances")
    await load.more(300)
    # On a fast run all of that takes less than SETTLE_S: the load goes on until requests
    # sent after it are answered, for the check that they all come from version 2.
    settled = marks["v2_ready"] + SETTLE_S
    while not any(answer.sent_s >= settled for answer in load.answers):
        await load.more(30)
    load.stop.set()
    return marks


async def readiness(url: str, load: Load) -> list[int]:
    """The server's readiness, sampled while the load runs."""
    statuses = []
    async with httpx.AsyncClient(timeout=10) as client:
        while not load.stop.is_set():
            statuses.append((await client.get(f"{url}/v2/health/ready")).status_code)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(load.stop.wait(), 0.2)
    return statuses


@pytest.mark.timeout(240)
async def test_loads_unloads_version_swaps_and_config_changes_fail_no_request(
    tmp_path: Path,
) -> None:
    write_config(tmp_path / "a", mlp_config("a"))
    add_version(tmp_path / "a", 1)
    env = {
        "WEIR_MODEL_CONTROL_MODE": "poll",
        "WEIR_REPOSITORY_POLL_SECS": str(POLL_S),
    }
    with private_mesh(tmp_path, env) as mesh:
        load = Load(mesh.url, "a", concurrency=30)
        answers, marks, ready_statuses = await asyncio.gather(
            load.run(200), changes(mesh.url, tmp_path, load), readiness(mesh.url, load)
        )

    assert len(answers) > 300
    assert set(ready_statuses) == {200}, "the server left readiness during a change"
    failures = load.failures()
    assert not failures, f"{len(failures)} of {len(answers)} failed, first: {failures[:3]}"
    switch_by = marks["v2_added"] + 2 * POLL_S
    # Once version 2 is served, version 1 closes after a few refresh periods (0.5 s each).
    assert load.versions_since(marks["v2_ready"] + SETTLE_S) == {"2"}, "a kept answering from 1"
    assert "1" in {a.version for a in answers if a.sent_s < marks["v2_added"]}
    first_v2 = min(a.sent_s for a in answers if a.version == "2")
    assert first_v2 <= switch_by, f"version 2 answered {first_v2 - marks['v2_added']:.1f} s late"
