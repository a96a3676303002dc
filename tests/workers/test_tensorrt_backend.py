"""The TensorRT backend's checks and choices on plain data, and the plan builder's pure parts.

No GPU and no tensorrt here: engines are described as the backend's ``TensorInfo``, configs
are real ``ModelConfig`` objects, and the loader refuses cleanly without the tensorrt module.
What the backend and the builder ask of TensorRT and CUDA runs on a GPU only, in
tests/gpu (the device check); nothing here stands in for TensorRT.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from tests.weir import onnx_models
from weir.config import Backend, InstanceKind, ModelConfig
from weir.errors import ConfigError, InvalidInput
from weir.pbtxt import load_pbtxt
from workers.backends.tensorrt_backend import TensorRTBackend
from workers.backends.tensorrt_engine import (
    TensorInfo,
    check_io,
    choose_profile,
    max_profile_batch,
    profile_batches,
    triton_datatype,
)

ROOT = Path(__file__).resolve().parents[2]


def trt_config(max_batch_size: int = 8, **overrides: Any) -> ModelConfig:
    raw: dict[str, Any] = {
        "name": "plan",
        "backend": "tensorrt",
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}],
    }
    raw.update(overrides)
    return ModelConfig.model_validate(raw)


def engine_io(
    input_shape: tuple[int, ...] = (-1, 4),
    output_shape: tuple[int, ...] = (-1, 2),
    max_batches: tuple[int, ...] = (8,),
    datatype: str = "FP32",
) -> list[TensorInfo]:
    """An engine with INPUT0 and OUTPUT0, one profile per max batch (from batch 1)."""
    ranges = tuple(
        ((1, *input_shape[1:]), (batch, *input_shape[1:]), (batch, *input_shape[1:]))
        for batch in max_batches
    )
    return [
        TensorInfo("INPUT0", True, datatype, input_shape, ranges),
        TensorInfo("OUTPUT0", False, "FP32", output_shape),
    ]


def refusal(config: ModelConfig, infos: list[TensorInfo]) -> str:
    with pytest.raises(ConfigError) as info:
        check_io(config, infos)
    return str(info.value)


# --- datatypes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trt_name", "triton"),
    [
        ("FLOAT", "FP32"),
        ("HALF", "FP16"),
        ("BF16", "BF16"),
        ("INT8", "INT8"),
        ("INT32", "INT32"),
        ("INT64", "INT64"),
        ("BOOL", "BOOL"),
        ("UINT8", "UINT8"),
    ],
)
def test_tensorrt_datatypes_map_to_tritons_names(trt_name: str, triton: str) -> None:
    assert triton_datatype(trt_name) == triton


def test_a_tensorrt_type_triton_lacks_matches_no_config_datatype() -> None:
    assert triton_datatype("FP8") == "TensorRT FP8"
    config = trt_config()
    message = refusal(config, engine_io(datatype=triton_datatype("FP8")))
    assert "TensorRT FP8" in message and "FP32" in message


# --- the engine against the config ---------------------------------------------------------


def test_an_engine_with_a_dynamic_batch_serves_its_batching_config() -> None:
    check_io(trt_config(max_batch_size=8), engine_io(max_batches=(8,)))


def test_a_config_input_the_engine_lacks_is_refused_by_name() -> None:
    config = trt_config(input=[{"name": "IMAGE", "data_type": "TYPE_FP32", "dims": [4]}])
    message = refusal(config, engine_io())
    assert "the engine has no input 'IMAGE'" in message
    assert "'INPUT0'" in message


def test_a_config_output_the_engine_lacks_is_refused_by_name() -> None:
    config = trt_config(
        output=[
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]},
            {"name": "SCORES", "data_type": "TYPE_FP32", "dims": [2]},
        ]
    )
    assert "the engine has no output 'SCORES'" in refusal(config, engine_io())


def test_an_engine_input_the_config_lacks_is_refused_by_name() -> None:
    infos = [*engine_io(), TensorInfo("MASK", True, "FP32", (-1, 4), (((1, 4), (8, 4), (8, 4)),))]
    message = refusal(trt_config(), infos)
    assert "the engine's input 'MASK' is not in the config" in message


def test_a_datatype_mismatch_names_both_datatypes() -> None:
    message = refusal(trt_config(), engine_io(datatype="FP16"))
    assert "tensor 'INPUT0'" in message
    assert "the engine's datatype is FP16, the config's FP32" in message


def test_non_batch_dims_that_disagree_are_refused_with_both_shapes() -> None:
    message = refusal(trt_config(), engine_io(input_shape=(-1, 5)))
    assert "tensor 'INPUT0'" in message
    assert "[-1, 5]" in message and "[4]" in message


def test_a_rank_mismatch_is_refused() -> None:
    assert "tensor 'INPUT0'" in refusal(trt_config(), engine_io(input_shape=(-1, 4, 1)))


def test_a_variable_dim_on_either_side_matches_any_size() -> None:
    dynamic_config = trt_config(input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}])
    check_io(dynamic_config, engine_io(input_shape=(-1, 4)))
    check_io(trt_config(), engine_io(input_shape=(-1, -1)))


def test_a_fixed_batch_dim_is_refused_when_the_config_batches_more_than_one() -> None:
    message = refusal(trt_config(max_batch_size=8), engine_io(input_shape=(8, 4)))
    assert "batch dim is fixed at 8" in message
    assert "max_batch_size 8" in message


def test_a_batch_dim_fixed_at_one_serves_max_batch_size_one() -> None:
    check_io(trt_config(max_batch_size=1), engine_io(input_shape=(1, 4), output_shape=(1, 2)))


def test_a_config_that_does_not_batch_compares_the_whole_shape() -> None:
    config = trt_config(
        max_batch_size=0,
        input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3, 4]}],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3, 2]}],
    )
    fixed = [
        TensorInfo("INPUT0", True, "FP32", (3, 4), (((3, 4), (3, 4), (3, 4)),)),
        TensorInfo("OUTPUT0", False, "FP32", (3, 2)),
    ]
    check_io(config, fixed)
    message = refusal(config, engine_io(input_shape=(4, 4), output_shape=(3, 2)))
    assert "the engine's shape [4, 4] does not match the config's dims [3, 4]" in message


def test_a_batching_config_needs_a_batch_dim_on_each_tensor() -> None:
    scalar = [engine_io()[0], TensorInfo("OUTPUT0", False, "FP32", ())]
    config = trt_config(output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": []}])
    assert "tensor 'OUTPUT0'" in refusal(config, scalar)


def test_max_batch_size_beyond_every_profile_is_refused_with_the_numbers() -> None:
    message = refusal(trt_config(max_batch_size=64), engine_io(max_batches=(16, 32)))
    assert "max_batch_size 64" in message
    assert "admit, 32" in message
    assert "per profile: 16, 32" in message


def test_max_batch_size_within_one_profile_is_served() -> None:
    check_io(trt_config(max_batch_size=32), engine_io(max_batches=(16, 32)))


def test_a_shape_tensor_is_refused() -> None:
    infos = engine_io()
    infos[0] = TensorInfo("INPUT0", True, "FP32", (-1, 4), infos[0].ranges, shape_tensor=True)
    assert "shape tensor" in refusal(trt_config(), infos)


def test_a_profile_admits_the_least_max_batch_of_its_inputs() -> None:
    ranges_a = (((1, 4), (4, 4), (8, 4)), ((1, 4), (16, 4), (32, 4)))
    ranges_b = (((1, 3), (2, 3), (4, 3)), ((1, 3), (16, 3), (64, 3)))
    infos = [
        TensorInfo("A", True, "FP32", (-1, 4), ranges_a),
        TensorInfo("B", True, "FP32", (-1, 3), ranges_b),
        TensorInfo("OUT", False, "FP32", (-1, 2)),
    ]
    assert profile_batches(infos) == [4, 32]
    assert max_profile_batch(infos) == 32


def test_no_input_ranges_admit_no_batch() -> None:
    assert max_profile_batch([TensorInfo("OUT", False, "FP32", (-1, 2))]) == 0


# --- choosing a profile ---------------------------------------------------------------------

TWO_PROFILES = [
    {"INPUT0": ((1, 4), (4, 4), (8, 4))},
    {"INPUT0": ((1, 4), (32, 4), (64, 4))},
]


def test_the_preferred_profile_runs_a_batch_it_admits() -> None:
    assert choose_profile(TWO_PROFILES, {"INPUT0": (6, 4)}, preferred=1) == 1
    assert choose_profile(TWO_PROFILES, {"INPUT0": (6, 4)}, preferred=0) == 0


def test_a_batch_the_preferred_profile_refuses_runs_on_an_admitting_one() -> None:
    assert choose_profile(TWO_PROFILES, {"INPUT0": (20, 4)}, preferred=0) == 1


def test_of_admitting_profiles_the_nearest_opt_wins() -> None:
    profiles = [*TWO_PROFILES, {"INPUT0": ((1, 4), (8, 4), (16, 4))}]
    assert choose_profile(profiles, {"INPUT0": (7, 4)}, preferred=1) == 1  # admitted: kept
    assert choose_profile(profiles, {"INPUT0": (7, 4)}, preferred=5) == 2  # |7-8| is least


def test_a_tie_between_profiles_goes_to_the_lowest_index() -> None:
    same = [{"INPUT0": ((1, 4), (4, 4), (8, 4))}] * 3
    assert choose_profile(same, {"INPUT0": (2, 4)}, preferred=-1) == 0


def test_every_input_must_fit_the_same_profile() -> None:
    profiles = [
        {"A": ((1,), (4,), (8,)), "B": ((1,), (4,), (8,))},
        {"A": ((1,), (32,), (64,)), "B": ((1,), (32,), (64,))},
    ]
    assert choose_profile(profiles, {"A": (20,), "B": (6,)}, preferred=0) == 1


def test_a_batch_no_profile_admits_is_invalid_input_naming_shape_and_ranges() -> None:
    with pytest.raises(InvalidInput) as info:
        choose_profile(TWO_PROFILES, {"INPUT0": (128, 4)}, preferred=0)
    message = info.value.message
    assert "input 'INPUT0' has shape [128, 4]" in message
    assert "profile 0 admits [1, 4] to [8, 4]" in message
    assert "profile 1 admits [1, 4] to [64, 4]" in message


def test_a_shape_of_another_rank_is_admitted_by_no_profile() -> None:
    with pytest.raises(InvalidInput, match=r"shape \[4\]"):
        choose_profile(TWO_PROFILES, {"INPUT0": (4,)}, preferred=0)


# --- loading without tensorrt --------------------------------------------------------------


def test_loading_without_the_tensorrt_module_names_the_model_and_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    (tmp_path / "model.plan").write_bytes(b"not a plan")
    with pytest.raises(ConfigError) as info:
        TensorRTBackend(trt_config(), tmp_path, device=0)
    assert "model 'plan'" in str(info.value)
    assert "tensorrt" in str(info.value)


def test_importing_the_backend_imports_neither_tensorrt_nor_torch() -> None:
    code = textwrap.dedent(
        """
        import sys
        import workers.backends.tensorrt_backend
        print(sorted({"tensorrt", "torch"} & set(sys.modules)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


# --- examples/build_tensorrt.py ------------------------------------------------------------


@pytest.fixture(scope="module")
def build_tensorrt() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_tensorrt", ROOT / "examples" / "build_tensorrt.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def onnx_config(max_batch_size: int = 64, **overrides: Any) -> ModelConfig:
    return trt_config(max_batch_size, backend="onnxruntime", **overrides)


def test_the_default_profile_spans_one_to_max_batch_size_optimal_at_half(
    build_tensorrt: types.ModuleType,
) -> None:
    assert build_tensorrt.default_profile(onnx_config(64)) == (1, 32, 64)
    assert build_tensorrt.default_profile(onnx_config(1)) == (1, 1, 1)
    assert build_tensorrt.default_profile(onnx_config(0)) == (1, 1, 1)


def test_a_profile_argument_is_min_opt_max_in_order(build_tensorrt: types.ModuleType) -> None:
    assert build_tensorrt.parse_profile("1:8:16") == (1, 8, 16)
    for bad in ("1:8", "a:b:c", "8:1:16", "0:1:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            build_tensorrt.parse_profile(bad)


def test_profiles_that_stop_short_of_max_batch_size_are_refused(
    build_tensorrt: types.ModuleType,
) -> None:
    build_tensorrt.check_profiles(onnx_config(16), [(1, 4, 8), (1, 8, 16)])
    with pytest.raises(ConfigError, match=r"max_batch_size 64 .* largest is 16"):
        build_tensorrt.check_profiles(onnx_config(64), [(1, 8, 16)])


def test_profile_shapes_put_the_batch_first_and_keep_the_onnx_dims(
    build_tensorrt: types.ModuleType,
) -> None:
    shapes = build_tensorrt.profile_shapes(onnx_config(), {"INPUT0": (-1, 4)}, (1, 32, 64))
    assert shapes == {"INPUT0": ((1, 4), (32, 4), (64, 4))}


def test_a_dim_the_onnx_model_leaves_dynamic_takes_the_configs_size(
    build_tensorrt: types.ModuleType,
) -> None:
    shapes = build_tensorrt.profile_shapes(onnx_config(), {"INPUT0": (-1, -1)}, (1, 2, 4))
    assert shapes == {"INPUT0": ((1, 4), (2, 4), (4, 4))}


def test_a_dim_dynamic_in_both_model_and_config_is_refused(
    build_tensorrt: types.ModuleType,
) -> None:
    config = onnx_config(input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}])
    with pytest.raises(ConfigError, match=r"input 'INPUT0'.*dynamic"):
        build_tensorrt.profile_shapes(config, {"INPUT0": (-1, -1)}, (1, 2, 4))


def test_a_model_that_does_not_batch_gets_fixed_shapes(build_tensorrt: types.ModuleType) -> None:
    config = onnx_config(0, input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3, 4]}])
    shapes = build_tensorrt.profile_shapes(config, {"INPUT0": (3, 4)}, (1, 1, 1))
    assert shapes == {"INPUT0": ((3, 4), (3, 4), (3, 4))}


def test_the_written_config_loads_as_the_same_model_on_the_gpu(
    build_tensorrt: types.ModuleType, tmp_path: Path
) -> None:
    source = onnx_config(
        16,
        input=[
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]},
            {"name": "MASK", "data_type": "TYPE_BOOL", "dims": [-1, 3]},
        ],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP16", "dims": []}],
        dynamic_batching={
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": 2000,
            "default_queue_policy": {"max_queue_size": 32, "timeout_action": "DELAY"},
        },
    )
    text = build_tensorrt.config_text(source, "mlp_trt", "mlp_onnx", instances=2)
    path = tmp_path / "mlp_trt" / "config.pbtxt"
    path.parent.mkdir()
    path.write_text(text)

    built = load_pbtxt(path, "mlp_trt")

    assert built.backend is Backend.TENSORRT
    assert "tensorrt_plan" in text
    assert (built.input, built.output) == (source.input, source.output)
    assert built.max_batch_size == 16
    assert built.dynamic_batching == source.dynamic_batching
    assert [(g.kind, g.count) for g in built.instance_group] == [(InstanceKind.GPU, 2)]


def test_a_config_without_dynamic_batching_is_written_without_it(
    build_tensorrt: types.ModuleType, tmp_path: Path
) -> None:
    text = build_tensorrt.config_text(onnx_config(0), "plain", "src", instances=1)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.pbtxt").write_text(text)
    built = load_pbtxt(tmp_path / "plain" / "config.pbtxt", "plain")
    assert built.dynamic_batching is None and built.max_batch_size == 0


def test_the_source_config_is_completed_from_the_onnx_model(
    build_tensorrt: types.ModuleType, tmp_path: Path
) -> None:
    model_dir = tmp_path / "ident_onnx"
    onnx_models.save(onnx_models.identity("FP32", ("batch", 3)), model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')

    entry, onnx_file = build_tensorrt.source_model(model_dir)

    assert onnx_file == model_dir.resolve() / "1" / "model.onnx"
    assert [(s.name, s.datatype, s.dims) for s in entry.config.input] == [("INPUT0", "FP32", (3,))]
    assert [s.name for s in entry.config.output] == ["OUTPUT0"]


def test_a_source_that_is_not_an_onnx_model_is_refused(
    build_tensorrt: types.ModuleType, tmp_path: Path
) -> None:
    model_dir = tmp_path / "torchy"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.pt").write_bytes(b"")
    (model_dir / "config.pbtxt").write_text(
        textwrap.dedent(
            """
            backend: "pytorch"
            max_batch_size: 8
            input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
            output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 2 ] } ]
            """
        )
    )
    with pytest.raises(ConfigError, match="not onnxruntime"):
        build_tensorrt.source_model(model_dir)
