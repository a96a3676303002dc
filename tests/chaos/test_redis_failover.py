"""Redis's primary killed under load: every request answered once, correctly, none hangs.

Two ways a mesh's Redis can lose what it acknowledged: Sentinel promotes the replica of a
SIGKILLed primary (replication is asynchronous, so the last writes may not have reached
it), and a Redis without persistence restarts empty. Either way the gateway notices another
server behind its connection and re-submits what it accepted (gateway.resubmission).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen
from types import ModuleType

import numpy as np
import pytest
import redis
import torch

from gateway.admission import MEMORY_SAMPLE_S
from tests.chaos.helpers import Outcome, Topology, closed_loop, private_repository
from tests.conftest import wait_until
from tests.redis_cluster import ClusterSet
from tests.replicated_redis import SentinelSet
from weir.redis_server import RedisServer, free_port

CLIENTS = 100
# Long enough that a request the mesh lost would show as a 504 only if it hung for good.
REQUEST_TIMEOUT_S = "30"
# Requests the stalled batcher has not read when Redis goes: held by Redis only.
REDIS_ONLY = 20
REQUESTS = "weir:{tiny_mlp}:1:requests"
# The refusal of a request for Redis's memory names the setting.
MEMORY_REFUSAL = "WEIR_GATEWAY_ADMISSION_MEMORY_FRACTION"


def wait_redis_only(port: int) -> None:
    """Until the server on ``port`` holds REDIS_ONLY requests no batcher has read yet."""

    def undelivered() -> int:
        with redis.Redis(port=port) as client:
            groups = client.xinfo_groups(REQUESTS)
        return sum(int(g.get("lag") or 0) for g in groups)

    wait_until(lambda: undelivered() >= REDIS_ONLY, 10, f"{REDIS_ONLY} requests held by Redis")


def run_through(
    redis_url: str, kill: Callable[[Popen[bytes]], None], tmp_path: Path, example_repository: Path,
    build_models: ModuleType,
) -> tuple[list[Outcome], dict[str, float], str]:  # fmt: skip
    """Load the mesh with CLIENTS closed-loop clients, ``kill`` Redis, load on after recovery.

    ``kill`` gets the batcher and stalls it (SIGSTOP, continued after ``kill``) until Redis
    holds REDIS_ONLY requests it has not read, then Redis goes: those are in Redis only (no
    service read them), the ones a server that lost them would leave to their deadline,
    unless the gateway queues them again.
    """
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    rows = np.random.default_rng(7).standard_normal((256, 64), dtype=np.float32)
    with torch.inference_mode():
        expected = build_models.reference_module("tiny_mlp")(torch.from_numpy(rows)).numpy()
    settings = {"WEIR_HEARTBEAT_TTL_S": "2", "WEIR_GATEWAY_REQUEST_TIMEOUT_S": REQUEST_TIMEOUT_S}
    mesh = Topology(redis_url, repository, tmp_path, settings)
    outcomes: list[Outcome] = []
    window: dict[str, float] = {}
    try:
        url = mesh.start_mesh(free_port())

        def served_after(t: float, count: int = 1) -> bool:
            return sum(o.status == 200 and o.sent_s > t for o in list(outcomes)) >= count

        async def run() -> None:
            stop = asyncio.Event()
            load = asyncio.create_task(
                closed_loop(lambda: [url], "tiny_mlp", rows, CLIENTS, stop, 1_000_000, outcomes)
            )
            await asyncio.to_thread(wait_until, lambda: len(outcomes) > 500, 30, "load")
            window["kill"] = time.monotonic()
            try:
                await asyncio.to_thread(kill, mesh.by_name["batcher"])
            finally:
                mesh.by_name["batcher"].send_signal(signal.SIGCONT)
            window["back"] = time.monotonic()
            try:
                await asyncio.to_thread(
                    wait_until, lambda: served_after(window["back"]), 30, "recovery"
                )
                # Load on until serving is plainly back: check() wants 100 served after it.
                await asyncio.to_thread(
                    wait_until, lambda: served_after(window["back"], 300), 30, "serving to go on"
                )
            except pytest.fail.Exception as exc:  # say what the clients and the gateway saw
                pytest.fail(f"{exc}\n{explain(list(outcomes), window, mesh.log('gateway'))}")
            stop.set()
            await load

        asyncio.run(run())
        log = mesh.log("gateway")
    finally:
        mesh.stop_all()
    for outcome in (o for o in outcomes if o.status == 200):
        np.testing.assert_allclose(outcome.output, expected[outcome.row], atol=1e-5)
    return outcomes, window, log


def explain(outcomes: list[Outcome], window: dict[str, float], log: str) -> str:
    """The answers so far by status, before and after recovery, and the gateway's last lines."""
    after = [o for o in outcomes if o.sent_s > window["back"]]
    before = [o for o in outcomes if o.sent_s <= window["back"]]
    counts = {
        label: {
            status: sum(o.status == status for o in group) for status in {o.status for o in group}
        }
        for label, group in (("sent before recovery", before), ("sent after", after))
    }
    return f"answers by status: {counts}\ngateway log, last lines:\n{log[-4000:]}"


def check(outcomes: list[Outcome], window: dict[str, float], log: str) -> None:
    statuses = {status: sum(o.status == status for o in outcomes) for status in (200, 503)}
    print(f"failover: {len(outcomes)} requests, {statuses[200]} answered 200, "
          f"{statuses[503]} refused 503 while Redis was away")  # fmt: skip
    # Every request got one answer: 200, or a 503 (retry later) only while Redis was away;
    # none was lost to a deadline (504) or a dropped connection (0).
    assert [(o.status, o.error) for o in outcomes if o.status not in (200, 503)] == []
    resumed = min(o.sent_s for o in outcomes if o.status == 200 and o.sent_s > window["back"])
    for outcome in (o for o in outcomes if o.status == 503):
        # Answered once the kill began (a loaded machine may hold a request sent before it
        # for seconds), and sent no later than the first request served after recovery, or,
        # when refused for Redis's memory, than the gateway's next read of it: a reading
        # sent before Redis was set right may be answered after a request already got in.
        last_s = resumed + (2 * MEMORY_SAMPLE_S if MEMORY_REFUSAL in outcome.error else 0)
        assert window["kill"] <= outcome.done_s and outcome.sent_s <= last_s, outcome.error
    assert sum(o.status == 200 and o.sent_s > resumed for o in outcomes) > 100
    # The requests in flight when Redis went were queued again, not left to their deadline.
    assert "re-submitting the" in log, log[-3000:]


@pytest.mark.timeout(180)
def test_sentinel_failover_loses_no_request(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    with SentinelSet() as sentinel:
        old_port = sentinel.primary_port()

        def kill_primary(batcher: Popen[bytes]) -> None:
            # The replica loses its link while the primary takes writes, so they never reach
            # it: what asynchronous replication loses when a primary dies at a bad moment.
            replica = sentinel.replica.process
            assert replica is not None
            replica.send_signal(signal.SIGSTOP)
            with redis.Redis(port=old_port) as primary:
                primary.client_kill_filter(_type="replica")
            batcher.send_signal(signal.SIGSTOP)
            wait_redis_only(old_port)
            sentinel.primary.kill()
            replica.send_signal(signal.SIGCONT)
            sentinel.wait_failover(old_port, 30)

        outcomes, window, log = run_through(
            sentinel.url, kill_primary, tmp_path, example_repository, build_models
        )
    check(outcomes, window, log)


@pytest.mark.timeout(180)
def test_cluster_failover_loses_no_request(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    with ClusterSet() as cluster:
        primary = cluster.primary_of("{tiny_mlp}")
        (replica_port,) = [r for r, p in cluster._primary_of_replica.items() if p == primary.port]
        replica = cluster.node(replica_port)

        def kill_primary(batcher: Popen[bytes]) -> None:
            # As with Sentinel: the model's replica loses its link while its primary takes
            # writes, then the primary dies and the replica, behind, is promoted.
            assert replica.process is not None
            replica.process.send_signal(signal.SIGSTOP)
            with redis.Redis(port=primary.port) as client:
                client.client_kill_filter(_type="replica")
            batcher.send_signal(signal.SIGSTOP)
            wait_redis_only(primary.port)
            primary.kill()
            replica.process.send_signal(signal.SIGCONT)
            cluster.wait_failover(primary.port, 30)

        outcomes, window, log = run_through(
            cluster.url, kill_primary, tmp_path, example_repository, build_models
        )
    check(outcomes, window, log)


@pytest.mark.timeout(180)
def test_redis_restarted_empty_loses_no_request(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    with RedisServer() as server:  # no persistence: it comes back with nothing

        def restart_empty(batcher: Popen[bytes]) -> None:
            batcher.send_signal(signal.SIGSTOP)
            wait_redis_only(server.port)
            server.kill()
            server.start()

        outcomes, window, log = run_through(
            server.url, restart_empty, tmp_path, example_repository, build_models
        )
    check(outcomes, window, log)


@pytest.mark.timeout(180)
def test_a_server_change_is_acted_on_even_when_the_first_try_fails(
    tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    # Redis comes back empty and, at first, refusing every write (past its maxmemory): the
    # gateway sees another server but cannot make its reply stream there yet. It must try
    # again, and queue again what it accepted, once it can, not take the change as done.
    gateway_log = tmp_path / "gateway.log"
    with RedisServer() as server:

        def restart_refusing(batcher: Popen[bytes]) -> None:
            batcher.send_signal(signal.SIGSTOP)
            wait_redis_only(server.port)
            server.kill()
            server.maxmemory = "1"
            server.start()
            wait_until(lambda: "OOM" in gateway_log.read_text(errors="replace"), 30, "a refusal")
            with redis.Redis(port=server.port) as client:
                client.config_set("maxmemory", 0)

        outcomes, window, log = run_through(
            server.url, restart_refusing, tmp_path, example_repository, build_models
        )
    check(outcomes, window, log)
