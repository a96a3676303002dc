"""How configs are completed from their models: the services' shared settings for it.

Kept apart from :mod:`weir.autocomplete` so that settings import nothing heavier.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default-max-batch-size
DEFAULT_PYTHON_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Completion:
    """What auto-complete gives, and how long a model's own completion may take."""

    # What a model that can batch gets when its config sets no max_batch_size.
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    # The longest a Triton Python model's auto_complete_config may run.
    python_timeout_s: float = DEFAULT_PYTHON_TIMEOUT_S
