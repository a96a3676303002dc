"""On a Redis Cluster: the handlers' metrics and a stalled worker's registration.

The worker publishes its handlers' series in one transaction on one key, the gateway finds
every worker's hash whichever primary holds it, and the stall guard's blocking client keeps
a registered worker live, as on one server.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from gateway.handler_families import handler_families
from tests.workers.test_handler_metrics import Instance
from weir import names
from weir.liveness import Heartbeat, live_consumers, prolong
from weir.redis_io.connection import connect, connect_sync
from workers.backends.torchserve_metrics import HandlerMetrics
from workers.handler_metrics import HandlerMetricsPublisher


def test_workers_hashes_on_several_primaries_are_all_served(redis_cluster: Any) -> None:
    workers = [f"cpu-{uuid.uuid4().hex}" for _ in range(8)]  # hashes spread over the slots

    async def publish() -> None:
        client = connect(redis_cluster.url)
        try:
            for worker in workers:
                metrics = HandlerMetrics("m")
                metrics.set_request_ids({0: "r"})
                metrics.add_counter("Rows", 1)
                publisher = HandlerMetricsPublisher(
                    client, worker, 60.0, lambda m=metrics: [Instance(m)], "h"
                )
                await publisher.publish_once()
        finally:
            await client.aclose()

    asyncio.run(publish())
    sync = connect_sync(redis_cluster.url)
    try:
        (family,) = [f for f in handler_families(sync) if f.name == "Rows"]
        (sample,) = family.samples
        assert sample.value == 8  # one per worker, summed
    finally:
        for worker in workers:
            sync.delete(names.handler_metrics(worker))
        sync.close()


def test_prolong_keeps_a_stalled_worker_registered_on_a_cluster(redis_cluster: Any) -> None:
    group = f"g-{uuid.uuid4().hex}"

    async def beat_then_read() -> dict[str, bytes]:
        client = connect(redis_cluster.url)
        try:
            await Heartbeat(client, group, "stalled", 0.0, lambda: b"[]").beat()  # lapsed
            sync = connect_sync(redis_cluster.url)
            try:
                prolong(sync, group, "stalled", 60.0)
            finally:
                sync.close()
            return await live_consumers(client, group)
        finally:
            await client.aclose()

    assert asyncio.run(beat_then_read()) == {"stalled": b"[]"}
