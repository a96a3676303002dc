"""The process environment a worker runs torch in, set before torch is imported.

``OMP_WAIT_POLICY=PASSIVE``: after each parallel region, torch's OpenMP threads sleep
instead of spinning. Spinning threads hold a core that the gateway, the batcher and Redis
need between batches; on a 2-core machine it cost tiny_mlp 38 % of its throughput and the
worker 3x its CPU per request, while the raw compute time of the example models did not
change measurably. An ``OMP_WAIT_POLICY`` already in the environment wins.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def apply_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """Give ``environ`` the worker's defaults where it does not set them itself."""
    for name, value in DEFAULTS.items():
        environ.setdefault(name, value)
