"""A Triton Python model's config, completed by its own ``auto_complete_config``.

Triton calls ``TritonPythonModel.auto_complete_config(config)`` before it loads a Python
model, so a ``config.pbtxt`` may say no more than ``backend: "python"`` and the model fills
its inputs, outputs, ``max_batch_size``, dynamic batching and decoupled. Weir does the same
wherever the repository is read (:func:`weir.autocomplete.complete`): the model file of the
latest served version is run in a child process
(:mod:`workers.backends.triton_autocomplete`), given the config as Triton's JSON, and
only those fields of what it returns are taken. A model file that never names the hook
costs no process. A failure, or a hook that runs past ``WEIR_AUTOCOMPLETE_TIMEOUT_S``, is a
ConfigError naming the file and the model's own message.
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from weir.errors import ConfigError

logger = logging.getLogger(__name__)

HOOK = "auto_complete_config"
CHILD = "workers.backends.triton_autocomplete"
# What Triton's pb_utils.ModelConfig lets auto_complete_config change.
CHANGEABLE = ("max_batch_size", "input", "output", "dynamic_batching", "model_transaction_policy")
SHOWN_ERROR_CHARS = 2000


def defines_hook(path: Path) -> bool:
    """``path`` is a Triton Python model's file that names ``auto_complete_config``."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return False  # the loader reports a missing model file itself
    return "TritonPythonModel" in text and HOOK in text


def complete_python(raw: dict[str, Any], name: str, path: Path, timeout_s: float) -> dict[str, Any]:
    """``raw`` with what the model's ``auto_complete_config`` filled in."""
    given = {"name": name, "backend": "python", "max_batch_size": 0, "input": [], "output": []}
    given.update(copy.deepcopy(raw))
    returned = _run(path, given, timeout_s)
    filled = dict(raw)
    for field in CHANGEABLE:
        if field in returned and returned[field] != given.get(field):
            filled[field] = returned[field]
    return filled


def _run(path: Path, given: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    command = [sys.executable, "-m", CHILD, str(path)]
    try:
        done = subprocess.run(
            command, input=json.dumps(given).encode(), capture_output=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"{path}: TritonPythonModel.{HOOK} did not return within {timeout_s:g} s "
            "(WEIR_AUTOCOMPLETE_TIMEOUT_S)"
        ) from None
    if done.returncode != 0:
        raise ConfigError(f"{path}: TritonPythonModel.{HOOK} failed: {_said(done.stderr)}")
    printed = done.stderr.decode(errors="replace").strip()
    if printed:  # the model's own prints and logs
        logger.info("%s: %s printed: %s", path, HOOK, printed[-SHOWN_ERROR_CHARS:])
    try:
        returned = json.loads(done.stdout)
    except ValueError:
        returned = None
    if not isinstance(returned, dict):
        raise ConfigError(f"{path}: TritonPythonModel.{HOOK} gave no config back")
    return returned


def _said(stderr: bytes) -> str:
    """The child's last line of error (its own one-line report), cut to a bounded length."""
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    said = lines[-1] if lines else "the process ended with no message"
    return said[-SHOWN_ERROR_CHARS:]
