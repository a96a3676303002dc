"""Filesystem changes a concurrent reader sees whole, or not at all.

Weir's loader may scan the generated repository at any moment, and other gateway
processes may read the store's bookkeeping: files are written aside and renamed into
place, directories are built in a hidden sibling (the loader skips hidden entries) and
renamed, and a removed directory is first moved aside.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` by renaming, so no reader sees half a file."""
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as file:
        file.write(text)
    os.chmod(file.name, 0o644)  # not NamedTemporaryFile's 0600
    os.replace(file.name, path)


def staging_dir(parent: Path, name: str) -> Path:
    """A hidden directory in ``parent`` to build ``name`` in, then rename into place."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    staging.chmod(0o755)  # not mkdtemp's 0700: workers may run as another user
    return staging


def remove_tree(path: Path) -> None:
    """Remove the directory ``path``, if there, as one step a reader can see."""
    # Moved aside first, so the loader sees the directory go at once, not file by file.
    if not path.exists():
        return
    doomed = Path(tempfile.mkdtemp(prefix=f".{path.name}.removed.", dir=path.parent))
    os.rename(path, doomed / path.name)
    shutil.rmtree(doomed, ignore_errors=True)
