"""An archive's ``requirements.txt``, installed when the worker allows it.

TorchServe installs a model's requirements when ``install_py_dep_per_model`` is true; Weir
does the same when ``WEIR_WORKER_TS_INSTALL_REQUIREMENTS`` is true (``weir up`` sets it from
that ``config.properties`` key). pip installs them with the worker's Python into a directory
of the unpacked archive's own (``<archive dir>-packages`` in the archive cache), once per
archive content, whatever the number of instances or processes loading it; the archive's
directory is pip's working directory, so a requirement may name a wheel the archive ships
(``./extra.whl``). The directory is appended to ``sys.path``: a package the worker's own
environment has wins over the archive's copy, so no archive can replace a package Weir
itself runs on. pip reads its usual settings (``PIP_INDEX_URL``, ``PIP_NO_INDEX``,
``PIP_FIND_LINKS`` ...) from the worker's environment; a failed install fails the load
with pip's last words.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from weir.errors import ConfigError
from workers.loading import uncounted

logger = logging.getLogger(__name__)

DONE = ".installed"
PIP_TAIL_LINES = 5


def install(model: str, model_dir: Path, requirements_file: str) -> Path:
    """The directory holding ``requirements_file``'s packages, installed if not yet."""
    target = model_dir.with_name(f"{model_dir.name}-packages")
    if (target / DONE).is_file():
        return target
    lock = model_dir.with_name(f"{model_dir.name}-packages.lock")
    # Not the model's startup timeout's to count, as in TorchServe (workers.loading).
    with uncounted(), lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # one process installs; the others wait, then reuse
        if not (target / DONE).is_file():
            _pip_install(model, model_dir, requirements_file, target)
    return target


def _pip_install(model: str, model_dir: Path, requirements_file: str, target: Path) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    command = [
        sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-warn-script-location", "--target", str(staging), "-r", requirements_file,
    ]  # fmt: skip
    logger.info("model %s: installing %s into %s", model, requirements_file, target)
    done = subprocess.run(
        command, cwd=model_dir, capture_output=True, text=True, env=dict(os.environ)
    )
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        said = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        raise ConfigError(
            f"model '{model}': installing the archive's {requirements_file} failed: "
            + " / ".join(said[-PIP_TAIL_LINES:])
        )
    (staging / DONE).write_text("")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)


def add_to_path(packages: Path) -> None:
    """Make the installed packages importable, after the worker's own."""
    entry = str(packages)
    if entry not in sys.path:
        sys.path.append(entry)
