"""A one-input Python model for the tests whose handler is their own: FP32 ``X`` in, ``Y`` out."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

# A handler that answers X as Y.
ECHO = """
class Echo:
    def initialize(self, context):
        pass

    def inference(self, batch):
        return {"Y": batch["X"]}
"""


def write_sleeper(repository: Path, handler: str, **config: Any) -> Path:
    """Model ``sleeper`` in ``repository``: ``handler`` as its model.py; its version folder.

    One CPU instance, batches of one, ``config``'s fields added to (or over) those.
    """
    version = repository / "sleeper" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(textwrap.dedent(handler))
    base = {
        "name": "sleeper",
        "backend": "python",
        "max_batch_size": 1,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
        "dynamic_batching": {},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    (repository / "sleeper" / "config.yaml").write_text(yaml.safe_dump({**base, **config}))
    return version
