"""The ``weir`` command: services refuse a bad repository with a message naming file and field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("service", [["batcher"], ["worker", "--pool", "cpu"], ["gateway"]])
def test_bad_config_stops_start_up_naming_file_and_field(
    tmp_path: Path, service: list[str]
) -> None:
    model = tmp_path / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.yaml").write_text(
        "backend: pytorch\nmax_batch_size: 8\n"
        "input: [{name: X, data_type: TYPE_FLOAT, dims: [4]}]\n"
        "output: [{name: Y, data_type: TYPE_FP32, dims: [4]}]\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "weir.cli",
            *service,
            "--repository",
            str(tmp_path),
            "--redis-url",
            "redis://127.0.0.1:1/0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    output = result.stderr + result.stdout
    assert str(model / "config.yaml") in output
    assert "input.0.data_type" in output
    assert "TYPE_FLOAT" in output


def test_help_lists_every_service() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "weir.cli", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("up", "gateway", "batcher", "worker"):
        assert command in result.stdout
