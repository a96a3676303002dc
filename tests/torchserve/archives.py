"""Real TorchServe archives for tests, built by the ``torch-model-archiver`` CLI.

``build_archive`` writes a handler (and any extra files) into a private directory and runs
the archiver installed next to the test interpreter, so the archives are exactly what
TorchServe users produce. ``write_zip`` builds hand-made zips for the archives the
archiver would refuse to write (damaged or hostile ones).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

NOOP_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return [row.get("body") or row.get("data") for row in data]
"""

_SUFFIX = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}


def build_archive(
    dest_dir: Path,
    name: str,
    handler_source: str = NOOP_HANDLER,
    *,
    version: str = "1.0",
    serialized_file: Path | None = None,
    extra_files: Mapping[str, str | bytes] | None = None,
    config_yaml: str | None = None,
    archive_format: str = "default",
    requirements: str | None = None,
    handler_file: str = "handler.py",
) -> Path:
    """Build ``name``'s archive into ``dest_dir`` and return its path.

    The path is ``<dest_dir>/<name>.mar`` (``default``, ``zip-store``),
    ``<dest_dir>/<name>.tar.gz`` (``tgz``) or the directory ``<dest_dir>/<name>``
    (``no-archive``). ``extra_files`` maps paths inside the archive (``a/b.txt`` keeps its
    directory) to their content. ``handler_file`` is the ``--handler`` argument: a file
    (``handler.py``), a module and function (``entry:predict``, the source is written to
    ``entry.py``) or a built-in handler's name (``image_classifier``, the source unused).
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="weir-mar-") as scratch:
        sources = Path(scratch) / "sources"
        sources.mkdir()
        (sources / _handler_source_name(handler_file)).write_text(handler_source)
        args = _archiver_args(name, version, handler_file, archive_format, dest_dir)
        args += _optional_args(sources, serialized_file, extra_files, config_yaml, requirements)
        _run_archiver(args, cwd=sources, tmp=Path(scratch))
    return dest_dir / f"{name}{_SUFFIX[archive_format]}"


def write_zip(path: Path, members: Mapping[str, str | bytes]) -> Path:
    """A zip holding exactly ``members`` (names are written as given, unchecked)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for member, content in members.items():
            archive.writestr(member, content)
    return path


def _handler_source_name(handler: str) -> str:
    # The archiver copies `x.py` for a handler given as `x` or `x:function`.
    return handler if ".py" in handler else handler.split(":")[0] + ".py"


def _archiver_args(
    name: str, version: str, handler_file: str, archive_format: str, dest_dir: Path
) -> list[str]:
    return [
        "--model-name",
        name,
        "--version",
        version,
        "--handler",
        handler_file,
        "--archive-format",
        archive_format,
        "--export-path",
        str(dest_dir),
        "--force",
    ]


def _optional_args(
    sources: Path,
    serialized_file: Path | None,
    extra_files: Mapping[str, str | bytes] | None,
    config_yaml: str | None,
    requirements: str | None,
) -> list[str]:
    args: list[str] = []
    if serialized_file is not None:
        args += ["--serialized-file", str(serialized_file)]
    if extra_files:
        args += ["--extra-files", str(_write_extras(sources / "extras", extra_files))]
    if config_yaml is not None:
        (sources / "model-config.yaml").write_text(config_yaml)
        args += ["--config-file", "model-config.yaml"]
    if requirements is not None:
        (sources / "requirements.txt").write_text(requirements)
        args += ["--requirements-file", "requirements.txt"]
    return args


def _write_extras(root: Path, files: Mapping[str, str | bytes]) -> Path:
    # The archiver copies a directory's contents to the archive root, keeping sub-directories.
    for member, content in files.items():
        target = root / member
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        target.write_bytes(data)
    return root


def _run_archiver(args: list[str], *, cwd: Path, tmp: Path) -> None:
    script = Path(sys.executable).parent / "torch-model-archiver"
    command = [str(script)] if script.exists() else [sys.executable, "-c", _INLINE_CLI]
    # The archiver stages files in $TMPDIR/<model name> and deletes that directory first,
    # so two builds of one name at once would clobber each other without a private TMPDIR.
    env = {**os.environ, "TMPDIR": str(tmp)}
    result = subprocess.run(
        command + args, cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"torch-model-archiver failed: {result.stderr or result.stdout}")


_INLINE_CLI = (
    "import sys; from model_archiver.model_packaging import generate_model_archive; "
    "sys.exit(generate_model_archive())"
)
