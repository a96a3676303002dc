"""What a handler learns about the batch it runs: time left, and whether anyone waits."""

from __future__ import annotations

import math
import time

import numpy as np

from weir.tensors import Tensor
from weir.wire import InferRequest
from workers import batch_wait


def request(request_id: str, deadline_ms: int) -> InferRequest:
    tensor = Tensor.from_numpy(np.zeros((1, 1), np.float32))
    return InferRequest(request_id, "m", "1", {"X": tensor}, "reply", deadline_ms)


def now_ms() -> int:
    return int(time.time() * 1000)


def test_outside_a_batch_nothing_is_cancelled_and_time_is_endless() -> None:
    assert not batch_wait.is_cancelled()
    assert batch_wait.time_left_s() == math.inf


def test_a_batch_is_cancelled_only_when_no_request_is_waited_for() -> None:
    late = request("late", now_ms() - 1)
    waited = request("waited", now_ms() + 60_000)
    with batch_wait.running([late, waited], lambda _: False):
        assert not batch_wait.is_cancelled()
        assert 55 < batch_wait.time_left_s() <= 60
    with batch_wait.running([late, waited], lambda rid: rid == "waited"):
        assert batch_wait.is_cancelled()
    assert not batch_wait.is_cancelled()  # the block ended


def test_a_pipeline_step_counts_its_pipeline_request_cancelled() -> None:
    from weir.cancels import CancelWatch

    watch = CancelWatch("redis://127.0.0.1:1/0", 1.0)
    watch.canceled["gw-7"] = now_ms() + 60_000
    assert watch.is_canceled("gw-7")
    assert watch.is_canceled("gw-7/2")
    assert not watch.is_canceled("gw-70/2")
    with batch_wait.running([request("gw-7/1", now_ms() + 60_000)], watch.is_canceled):
        assert batch_wait.is_cancelled()


def test_a_request_without_deadline_is_always_waited_for() -> None:
    with batch_wait.running([request("warmup", 0)], lambda _: False):
        assert not batch_wait.is_cancelled()
        assert batch_wait.time_left_s() == math.inf
