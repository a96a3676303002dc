"""An archive's requirements.txt is installed when the worker allows it (install_py_dep_per_model).

The requirement is a wheel the archive ships, built here, and pip is told to use no index:
nothing is downloaded.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.torchserve.archives import build_archive
from weir.config import ModelConfig
from weir.errors import ConfigError
from weir.torchserve import envelope
from workers.backends import ArchiveOptions, load_backend

WHEEL = "weirtinydep-0.1-py3-none-any.whl"
HANDLER = """
import weirtinydep


def handle(data, context):
    if data is None:
        return None
    return [{"value": weirtinydep.VALUE} for _ in data]
"""


def tiny_wheel() -> bytes:
    """A pure-Python wheel of one module, ``weirtinydep`` (``VALUE = 42``)."""
    files = {
        "weirtinydep.py": b"VALUE = 42\n",
        "weirtinydep-0.1.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: weirtinydep\nVersion: 0.1\n"
        ),
        "weirtinydep-0.1.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: weir-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{name},sha256={_digest(data)},{len(data)}" for name, data in files.items()]
    files["weirtinydep-0.1.dist-info/RECORD"] = (
        "\n".join([*record, "weirtinydep-0.1.dist-info/RECORD,,"]) + "\n"
    ).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return buffer.getvalue()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def offline_pip(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    before = list(sys.path)
    yield
    sys.path[:] = before
    sys.modules.pop("weirtinydep", None)


def serve(tmp_path: Path, requirements: str, install: bool) -> object:
    archive = build_archive(
        tmp_path / "store",
        "needy",
        HANDLER,
        extra_files={WHEEL: tiny_wheel()},
        requirements=requirements,
    )
    version_dir = tmp_path / "repository" / "needy" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.mar").symlink_to(archive)
    config = ModelConfig.model_validate(
        {
            "name": "needy",
            "backend": "torchserve",
            "max_batch_size": 2,
            "input": envelope.INPUTS,
            "output": envelope.OUTPUTS,
        }
    )
    return load_backend(config, version_dir, archives=ArchiveOptions(install_requirements=install))


@pytest.mark.usefixtures("offline_pip")
def test_allowed_requirements_are_installed_for_the_handler(tmp_path: Path) -> None:
    backend = serve(tmp_path, f"./{WHEEL}\n", install=True)
    body = np.empty((1, 1), dtype=object)
    body[0, 0] = b"x"
    outputs = backend.infer({envelope.BODY: body})  # type: ignore[attr-defined]
    assert b'"value": 42' in outputs[envelope.RESPONSE][0, 0]


@pytest.mark.usefixtures("offline_pip")
def test_without_the_setting_requirements_are_not_installed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs the package 'weirtinydep'"):
        serve(tmp_path, f"./{WHEEL}\n", install=False)


@pytest.mark.usefixtures("offline_pip")
def test_a_failed_install_fails_the_load_with_pips_words(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"installing the archive's requirements\.txt failed"):
        serve(tmp_path, "weir-no-such-package==9.9\n", install=True)
