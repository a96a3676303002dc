"""A batch delivered too often is dead-lettered, its requests answered once with a 500,
and the CLI lists it and replays it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import redis
import torch

from tests.chaos.helpers import Topology, private_repository
from tests.conftest import ROOT, private_redis, wait_until
from weir import wire
from weir.errors import ErrorKind
from weir.redis_io.connection import connect_sync
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest

BATCHES = "weir:{tiny_mlp}:1:batches"
REPLIES = "test:replies"
MAX_DELIVERIES = 2


def batch_of(rows: np.ndarray) -> bytes:
    deadline_ms = int(time.time() * 1000) + 600_000
    requests = [
        InferRequest(f"r{i}", "tiny_mlp", "1", {"INPUT0": Tensor.from_numpy(rows[i : i + 1])},
                     REPLIES, deadline_ms)
        for i in range(len(rows))
    ]  # fmt: skip
    return wire.encode_batch([r.encode() for r in requests])


def replies(client: redis.Redis) -> list[InferReply]:
    return [
        InferReply.decode(payload)
        for _, fields in client.xrange(REPLIES)
        for payload in wire.decode_batch(fields[wire.PAYLOAD])
    ]


def cli(redis_url: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "weir.cli", "dead-letters", *args, "--redis-url", redis_url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stdout


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_poison_batch_is_dead_lettered_answered_once_and_replayable(
    kind: str, tmp_path: Path, example_repository: Path, build_models: ModuleType
) -> None:
    repository = private_repository(example_repository, tmp_path / "models", ["tiny_mlp"])
    rows = np.random.default_rng(3).standard_normal((2, 64), dtype=np.float32)
    with private_redis(kind) as server:
        client = connect_sync(server.url)
        # A batch a dead consumer has already been handed MAX_DELIVERIES times.
        client.xgroup_create(BATCHES, "workers", id="0", mkstream=True)
        # Replies go only to a stream that exists, as a live gateway keeps its own.
        client.xadd(REPLIES, {"created": "1"}, maxlen=0, approximate=False)
        entry_id = client.xadd(BATCHES, {wire.PAYLOAD: batch_of(rows)})
        client.xreadgroup("workers", "ghost", {BATCHES: ">"})
        client.execute_command(
            "XCLAIM", BATCHES, "workers", "ghost", 0, entry_id, "RETRYCOUNT", MAX_DELIVERIES
        )
        garbage_id = client.xadd(BATCHES, {wire.PAYLOAD: b"\xc1 not msgpack"})
        mesh = Topology(
            server.url,
            repository,
            tmp_path,
            {"WEIR_WORKER_MAX_DELIVERIES": str(MAX_DELIVERIES), "WEIR_WORKER_RECLAIM_IDLE_MS": "0",
             "WEIR_WORKER_RECLAIM_INTERVAL_S": "0.1"},
        )  # fmt: skip
        try:
            mesh.start("worker", "worker")
            wait_until(lambda: client.xlen("weir:{tiny_mlp}:1:dead") == 2, 60, "two dead letters")
            wait_until(lambda: len(replies(client)) == 2, 10, "error replies")
            answered = replies(client)
            assert sorted(r.id for r in answered) == ["r0", "r1"]
            for reply in answered:
                assert reply.error is not None
                kind, message = reply.error
                assert kind == ErrorKind.INTERNAL
                assert "model 'tiny_mlp' version '1'" in message
                assert f"delivered {MAX_DELIVERIES + 1} times" in message
            assert client.xpending(BATCHES, "workers")["pending"] == 0

            listing = cli(server.url, "list")
            assert "requests=2" in listing and "requests=0" in listing
            assert "cannot be processed" in listing

            poison = next(line for line in listing.splitlines() if "requests=2" in line)
            cli(server.url, "replay", "--id", poison.split()[2])
            wait_until(lambda: len(replies(client)) == 4, 30, "replies to the replayed batch")
            with torch.inference_mode():
                expected = build_models.reference_module("tiny_mlp")(torch.from_numpy(rows)).numpy()
            for reply in replies(client)[2:]:
                assert reply.error is None
                row = int(reply.id[1:])
                got = reply.outputs["OUTPUT0"].to_numpy()
                np.testing.assert_allclose(got[0], expected[row], atol=1e-5)
            assert client.xlen("weir:{tiny_mlp}:1:dead") == 1
            assert garbage_id is not None
        finally:
            mesh.stop_all()
