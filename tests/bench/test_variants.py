"""The runtime variants on real files: derived configs, cached builds, and their raw limits.

tiny_mlp (built from its seed in a temporary repository) goes through every runtime here:
its export and conversion take seconds, where wide_mlp's and bert_mini's take a minute.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import yaml

from bench import raw
from bench.run import parse_args
from bench.variants import (
    RUNTIMES,
    Runtime,
    Variant,
    parse_runtimes,
    plan,
    served_name,
    variant_config,
)
from bench.workload import bench_repository, read_inputs, request_body, sample
from weir.repository import Repository

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models"
KEPT = ("max_batch_size", "input", "output", "dynamic_batching", "instance_group")
TINY = [Variant("tiny_mlp", runtime) for runtime in RUNTIMES]


@pytest.mark.parametrize("model", ["wide_mlp", "bert_mini"])
@pytest.mark.parametrize("runtime", [Runtime.ONNXRUNTIME, Runtime.OPENVINO])
def test_a_variant_config_is_the_torch_models_with_its_own_name_and_backend(
    model: str, runtime: Runtime
) -> None:
    torch_config = yaml.safe_load((EXAMPLES / model / "config.yaml").read_text())
    config = variant_config(torch_config, Variant(model, runtime))
    assert (
        config["name"]
        == served_name(model, runtime)
        == model
        + {
            Runtime.ONNXRUNTIME: "_onnx",
            Runtime.OPENVINO: "_openvino",
        }[runtime]
    )
    assert config["backend"] == runtime.value
    assert {k: config[k] for k in KEPT} == {k: torch_config[k] for k in KEPT}
    assert torch_config["name"] == model  # the source is left alone


def test_a_variant_config_drops_what_names_the_torch_format() -> None:
    torch_config = {"name": "m", "platform": "pytorch_libtorch", "max_batch_size": 8}
    torch_config["default_model_filename"] = "weights.pt"
    config = variant_config(torch_config, Variant("m", Runtime.OPENVINO))
    assert config == {"name": "m_openvino", "max_batch_size": 8, "backend": "openvino"}


def test_only_wide_mlp_and_bert_mini_go_through_the_other_runtimes() -> None:
    chosen = plan(["tiny_mlp", "wide_mlp"], [Runtime.TORCH, Runtime.OPENVINO])
    assert [v.name for v in chosen] == ["tiny_mlp", "wide_mlp", "wide_mlp_openvino"]
    assert [v.name for v in plan(["bert_mini"], [Runtime.ONNXRUNTIME])] == ["bert_mini_onnx"]


def test_runtimes_parse_in_the_order_given_and_an_unknown_one_is_refused() -> None:
    assert parse_runtimes("openvino, torch,openvino") == [Runtime.OPENVINO, Runtime.TORCH]
    assert parse_args([]).runtimes == list(RUNTIMES)
    with pytest.raises(ValueError, match="'tensorrt'"):
        parse_runtimes("torch,tensorrt")
    with pytest.raises(SystemExit):
        parse_args(["--runtimes", "tensorrt"])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, build_models: ModuleType) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("variants")
    build_models.build_model(root / "source", "tiny_mlp")
    paths = {"source": root / "source", "target": root / "repository", "cache": root / "cache"}
    bench_repository(paths["source"], TINY, paths["target"], paths["cache"])
    return paths


def test_weir_loads_every_variant_with_the_torch_models_batching(built: dict[str, Path]) -> None:
    repository = Repository.load(built["target"])  # checks each config against its model file
    backends = {entry.name: entry.config.backend for entry in repository}
    assert backends == {
        "tiny_mlp": "pytorch",
        "tiny_mlp_onnx": "onnxruntime",
        "tiny_mlp_openvino": "openvino",
    }
    torch_config = repository.models["tiny_mlp"].config
    for name in ("tiny_mlp_onnx", "tiny_mlp_openvino"):
        config = repository.models[name].config
        assert config.max_batch_size == torch_config.max_batch_size
        assert config.dynamic_batching == torch_config.dynamic_batching
        assert config.instance_group == torch_config.instance_group
        assert request_body(built["target"], name) == request_body(built["target"], "tiny_mlp")


def test_variant_files_are_linked_from_the_cache_not_the_examples(built: dict[str, Path]) -> None:
    for name, filename in [("tiny_mlp_onnx", "model.onnx"), ("tiny_mlp_openvino", "model.bin")]:
        served = built["target"] / name / "1" / filename
        assert served.samefile(built["cache"] / name / "1" / filename)
    assert not (EXAMPLES / "tiny_mlp_openvino").exists()


def _mtimes(cache: Path) -> list[int]:
    files = ["tiny_mlp_onnx/1/model.onnx", "tiny_mlp_openvino/1/model.xml"]
    return [(cache / f).stat().st_mtime_ns for f in files]


def test_variants_are_rebuilt_only_when_older_than_the_torch_model(built: dict[str, Path]) -> None:
    first = _mtimes(built["cache"])
    bench_repository(built["source"], TINY, built["target"], built["cache"])
    assert _mtimes(built["cache"]) == first
    torch_file = built["source"] / "tiny_mlp" / "1" / "model.pt"
    newer = max(first) + 1_000
    os.utime(torch_file, ns=(newer, newer))  # as if model.pt were rebuilt after the exports
    bench_repository(built["source"], TINY, built["target"], built["cache"])
    rebuilt = _mtimes(built["cache"])
    assert all(after > newer for after in rebuilt)
    Repository.load(built["target"])


def test_the_raw_limit_of_each_runtime_is_a_sane_rate(built: dict[str, Path]) -> None:
    names = [v.name for v in TINY]
    result = raw.measure(built["target"], names, threads=0, batch_sizes=(1, 8), min_s=0.05)
    assert result["threads"] == len(os.sched_getaffinity(0))
    assert list(result["models"]) == names
    for name in names:
        curve = result["models"][name]
        assert [r["batch_size"] for r in curve] == [1, 8]
        for r in curve:
            assert 0 < r["batch_ms"] < 100, (name, r)  # a 64-256-16 MLP
            assert r["samples_per_s"] == pytest.approx(r["batch_size"] / r["batch_ms"] * 1e3)


def _output(value: object) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    if isinstance(value, list):  # ONNX Runtime: one array per output
        return np.asarray(value[0])
    return np.asarray(next(iter(value.values())))  # type: ignore[attr-defined]  # OVDict


def test_every_runtime_computes_the_same_model(built: dict[str, Path]) -> None:
    [spec] = read_inputs(built["target"], "tiny_mlp")
    inputs = {spec.name: sample(spec, np.random.default_rng(0), batch_size=3)}
    outputs = {
        v.name: _output(raw.load_model(built["target"], v.name, threads=1)(inputs)()) for v in TINY
    }
    expected = outputs.pop("tiny_mlp")
    assert expected.shape == (3, 16)
    for name, values in outputs.items():
        np.testing.assert_allclose(values, expected, rtol=1e-4, atol=1e-5, err_msg=name)
