"""``dynamic_batching``'s queue policies: per priority level, as Triton's config writes them."""

from __future__ import annotations

from pathlib import Path

from tests.weir.test_config import config_error, load, valid_raw
from tests.weir.test_pbtxt import PLAIN_PBTXT, write
from weir.pbtxt import load_pbtxt

POLICIES = """
  priority_levels: 2
  default_queue_policy { max_queue_size: 64 }
  priority_queue_policy {
    key: 2
    value { timeout_action: DELAY default_timeout_microseconds: 5000 max_queue_size: 8 }
  }
"""


def test_a_levels_own_policy_is_read_from_config_pbtxt(tmp_path: Path) -> None:
    text = PLAIN_PBTXT.replace("max_queue_delay_microseconds: 500", POLICIES)
    batching = load_pbtxt(write(tmp_path / "tiny", "config.pbtxt", text), "tiny").dynamic_batching
    assert batching is not None
    assert batching.policy(0).max_queue_size == 64  # level 1: the default policy
    low = batching.policy(1)
    assert (low.max_queue_size, low.timeout_action, low.delays) == (8, "DELAY", True)
    assert batching.delays


def test_a_policy_for_a_level_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    raw = valid_raw(
        dynamic_batching={"priority_levels": 2, "priority_queue_policy": {3: {"max_queue_size": 1}}}
    )
    error, _ = config_error(tmp_path, raw)
    assert "priority_queue_policy names priority level 3; the levels are 1 to 2" in error


def test_delay_without_a_timeout_delays_nothing(tmp_path: Path) -> None:
    raw = valid_raw(dynamic_batching={"default_queue_policy": {"timeout_action": "DELAY"}})
    batching = load(tmp_path, raw).dynamic_batching
    assert batching is not None and not batching.delays
