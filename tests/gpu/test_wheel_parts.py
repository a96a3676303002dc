"""A wheel cut into parts for the GPU machine is joined whole, or refused saying why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.gpu.wheel_parts import MIB, join, plan, split


def test_parts_fit_their_sizes_and_the_last_is_the_small_one() -> None:
    assert plan(244 * MIB, 56 * MIB, 24 * MIB) == [56 * MIB] * 3 + [52 * MIB, 24 * MIB]
    assert plan(10 * MIB, 56 * MIB, 24 * MIB) == [10 * MIB]
    assert plan(30 * MIB, 56 * MIB, 24 * MIB) == [6 * MIB, 24 * MIB]


def test_a_split_wheel_joins_to_the_same_bytes_and_a_missing_or_changed_part_is_refused(
    tmp_path: Path,
) -> None:
    wheel = tmp_path / "onnxruntime_gpu-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(os.urandom(5 * MIB + 123))
    parts = split(wheel, tmp_path / "parts", part_mib=2, last_mib=0.5)
    assert [p.parent.name for p in parts] == ["1", "2", "3", "4"]
    assert [p.stat().st_size for p in parts] == [2 * MIB, 2 * MIB, MIB // 2 + 123, MIB // 2]

    joined = join(tmp_path / "parts", tmp_path / "out")
    assert joined.name == wheel.name and joined.read_bytes() == wheel.read_bytes()

    parts[1].write_bytes(parts[1].read_bytes()[::-1])
    with pytest.raises(ValueError, match="SHA-256"):
        join(tmp_path / "parts", tmp_path / "out")
    parts[2].unlink()
    with pytest.raises(ValueError, match=r"parts \[3\] of 4"):
        join(tmp_path / "parts", tmp_path / "out")
