"""A small repository with one diamond-shaped pipeline, written as config.yaml files.

    IN -> step 1 (unary) -> x -+-> step 2 (unary) -> l -+-> step 0 (join) -> OUT
                               +-> step 3 (unary) -> r -+

Step 0 is declared first, so ordering comes from the graph, not from the file. ``x`` is
read by two steps (fan-out); ``join`` needs the outputs of two steps (fan-in).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml


def tensor(name: str, dims: list[int], data_type: str = "TYPE_FP32") -> dict[str, Any]:
    return {"name": name, "data_type": data_type, "dims": dims}


def unary() -> dict[str, Any]:
    return {
        "name": "unary",
        "backend": "pytorch",
        "max_batch_size": 8,
        "input": [tensor("X", [4])],
        "output": [tensor("Y", [4])],
    }


def join() -> dict[str, Any]:
    return {
        "name": "join",
        "backend": "python",
        "max_batch_size": 16,
        "input": [tensor("A", [4]), tensor("B", [4])],
        "output": [tensor("Y", [2])],
    }


def diamond() -> dict[str, Any]:
    return {
        "name": "diamond",
        "platform": "ensemble",
        "max_batch_size": 8,
        "input": [tensor("IN", [4])],
        "output": [tensor("OUT", [2])],
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": "join",
                    "model_version": -1,
                    "input_map": {"A": "l", "B": "r"},
                    "output_map": {"Y": "OUT"},
                },
                {"model_name": "unary", "input_map": {"X": "IN"}, "output_map": {"Y": "x"}},
                {"model_name": "unary", "input_map": {"X": "x"}, "output_map": {"Y": "l"}},
                {"model_name": "unary", "input_map": {"X": "x"}, "output_map": {"Y": "r"}},
            ]
        },
    }


def write_model(root: Path, raw: dict[str, Any], versions: tuple[int, ...] = (1,)) -> Path:
    model_dir = root / raw["name"]
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(raw))
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
    return model_dir


def write_repository(
    root: Path,
    pipeline: dict[str, Any] | None = None,
    models: list[dict[str, Any]] | None = None,
) -> Path:
    """The diamond repository, with ``pipeline`` or ``models`` replacing the defaults."""
    for raw in models or [unary(), join()]:
        write_model(root, raw)
    write_model(root, pipeline or diamond(), versions=())
    return root


def steps_of(pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = pipeline["ensemble_scheduling"]["step"]
    return steps


def edited(edit: Any) -> dict[str, Any]:
    """A copy of the diamond pipeline after ``edit(pipeline)``."""
    pipeline = copy.deepcopy(diamond())
    edit(pipeline)
    return pipeline
