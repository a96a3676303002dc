"""Run a Triton Python model's ``auto_complete_config``, in a process of its own.

``python -m workers.backends.triton_autocomplete MODEL_PY`` reads the model's config as
Triton's JSON on stdin, imports ``MODEL_PY`` with ``triton_python_backend_utils`` in place,
calls ``TritonPythonModel.auto_complete_config`` with a :class:`pb_utils.ModelConfig` of it
and writes the config it returns, as JSON, on stdout. What the model prints goes to stderr,
so it cannot spoil the answer. A failure is one line on stderr and exit status 1.

Every service that reads the repository completes its configs (:mod:`weir.python_autocomplete`
starts this): a process of its own keeps the model's imports (torch, say) and whatever its
module does out of the gateway and the batcher, and bounds the call in time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from workers.backends import pb_utils
from workers.backends.python_backend import load_module
from workers.backends.triton_python import MODULE_NAME

HOOK = "auto_complete_config"


def complete(path: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The config ``auto_complete_config`` of the model at ``path`` returns for ``given``."""
    sys.modules.setdefault(MODULE_NAME, pb_utils)
    module = load_module(str(given.get("name") or "model"), path.parent, path)
    model = getattr(module, "TritonPythonModel", None)
    hook = getattr(model, HOOK, None)
    if hook is None:
        return given
    returned = hook(pb_utils.ModelConfig(given))
    if not isinstance(returned, pb_utils.ModelConfig):
        raise TypeError(
            f"TritonPythonModel.{HOOK} returned {type(returned).__name__}; it must return the "
            "pb_utils.ModelConfig it was given"
        )
    return returned.as_dict()


def main() -> int:
    path = Path(sys.argv[1])
    given = json.load(sys.stdin)
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the model's own prints, even from C, go to stderr
    sys.stdout = sys.stderr
    try:
        completed = complete(path, given)
    except Exception as exc:  # the model's own code: any failure is reported, one line
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    json.dump(completed, answer)
    answer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
