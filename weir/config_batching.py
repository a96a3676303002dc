"""Triton's ``dynamic_batching``: preferred sizes, queue delay, priority levels, queue policies.

The field names and their meaning are those of ``model_config.proto``. Priority levels are
numbered from 1, the highest; a request without one takes ``default_priority_level``. Each
level's queue follows its ``ModelQueuePolicy``: its own in ``priority_queue_policy`` (keyed by
level), else ``default_queue_policy``:

- ``max_queue_size``: requests of the level waiting to be batched; past it one is refused
  (503), as Triton refuses it. 0 is the gateway's default bound, not none
  (``WEIR_GATEWAY_DEFAULT_MAX_QUEUE_SIZE``).
- ``default_timeout_microseconds``: how long a request may wait in the queue. With
  ``timeout_action: REJECT`` it is then answered with an error (Triton's words); with
  ``DELAY`` it is not refused but put behind every request still within its time, as
  Triton's delayed queue.
- ``allow_timeout_override``: read; a request's own ``timeout`` parameter always lowers its
  deadline in Weir (Triton lets it only where this is true).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

REJECT = "REJECT"
DELAY = "DELAY"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueuePolicy(_Strict):
    """Triton's ``ModelQueuePolicy``: queue bound, default timeout and what it does."""

    timeout_action: str = Field(default=REJECT, pattern="^(REJECT|DELAY)$")
    default_timeout_microseconds: int = Field(default=0, ge=0)
    allow_timeout_override: bool = False
    max_queue_size: int = Field(default=0, ge=0)

    @property
    def delays(self) -> bool:
        """A request past its queue timeout waits behind the others instead of failing."""
        return self.timeout_action == DELAY and self.default_timeout_microseconds > 0


class DynamicBatching(_Strict):
    """Triton's ``dynamic_batching`` block (the fields Weir acts on)."""

    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    preserve_ordering: bool = False
    priority_levels: int = Field(default=0, ge=0)
    default_priority_level: int = Field(default=0, ge=0)
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _levels_as_numbers(cls, raw: Any) -> Any:
        # config.pbtxt's map has its keys as text ("1"), YAML's as numbers.
        policies = raw.get("priority_queue_policy") if isinstance(raw, dict) else None
        if isinstance(policies, dict):
            raw = {**raw, "priority_queue_policy": {int(k): v for k, v in policies.items()}}
        return raw

    @model_validator(mode="after")
    def _levels_in_range(self) -> DynamicBatching:
        if self.default_priority_level > self.priority_levels:
            raise ValueError(
                f"default_priority_level {self.default_priority_level} exceeds "
                f"priority_levels {self.priority_levels}"
            )
        for level in self.priority_queue_policy:
            if not 1 <= level <= self.priority_levels:
                raise ValueError(
                    f"priority_queue_policy names priority level {level}; the levels are 1 to "
                    f"{self.priority_levels} (priority_levels)"
                )
        return self

    def level_index(self, priority: int) -> int:
        """The queue level (0 first) of a request's ``priority`` (1 highest, 0 default)."""
        if not self.priority_levels:
            return 0
        level = priority or self.default_priority_level or self.priority_levels
        return level - 1

    def policy(self, index: int) -> QueuePolicy:
        """The queue policy of the level at ``index`` (0 first)."""
        return self.priority_queue_policy.get(index + 1, self.default_queue_policy)

    @property
    def delays(self) -> bool:
        """Some level's policy delays the requests past their queue timeout."""
        policies = [self.default_queue_policy, *self.priority_queue_policy.values()]
        return any(policy.delays for policy in policies)

    @field_validator("preferred_batch_size")
    @classmethod
    def _positive(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in value):
            raise ValueError("each preferred_batch_size must be positive")
        return tuple(sorted(set(value)))
