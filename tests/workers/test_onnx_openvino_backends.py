"""The ONNX Runtime and OpenVINO backends, in process: the same answers as torch, the
threads and properties they are given, and the errors of models they cannot run.

Real runtimes and real files: the example models built by examples/build_models.py and
small models built here with onnx.helper.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.weir import onnx_models
from weir.config import ModelConfig
from weir.errors import ConfigError
from weir.repository import Repository
from workers.backends import load_backend
from workers.threads import ThreadShare

# ONNX Runtime runs the same FP32 arithmetic as torch, up to operation order: measured up to
# 3e-7 here. OpenVINO's CPU plugin fuses and reorders more, and FP32 is its precision only
# where INFERENCE_PRECISION_HINT says f32 (the example config does; on a CPU with BF16 its
# default is bf16, faster and less precise): measured up to 4e-7 on bert_mini's logits.
# Both are asserted at 1e-5 absolute.
ORT_TOLERANCE = 1e-5
OPENVINO_TOLERANCE = 1e-5


def reference(build_models: ModuleType, name: str, batch: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module(name)(torch.from_numpy(batch)).numpy()


def example_input(name: str, rows: int) -> np.ndarray:
    rng = np.random.default_rng(rows)
    if name.startswith("bert_mini"):
        return rng.integers(0, 30522, (rows, 128), dtype=np.int64)
    return rng.standard_normal((rows, 64), dtype=np.float32)


@pytest.mark.parametrize(
    ("name", "source", "tolerance"),
    [
        ("tiny_mlp_onnx", "tiny_mlp", ORT_TOLERANCE),
        ("bert_mini_onnx", "bert_mini", ORT_TOLERANCE),
        ("bert_mini_openvino", "bert_mini", OPENVINO_TOLERANCE),
    ],
)
@pytest.mark.parametrize("rows", [1, 5])
def test_exported_models_answer_as_torch_does(
    example_repository: Path,
    build_models: ModuleType,
    name: str,
    source: str,
    tolerance: float,
    rows: int,
) -> None:
    entry = Repository.load(example_repository).models[name]
    backend = load_backend(entry.config, entry.version_path(entry.latest), ThreadShare(2), 2)
    spec = entry.config.input[0]
    batch = example_input(name, rows)
    out = backend.infer({spec.name: batch})[entry.config.output[0].name]
    np.testing.assert_allclose(out, reference(build_models, source, batch), rtol=0, atol=tolerance)


def onnx_config(name: str = "m", **fields: object) -> ModelConfig:
    raw: dict[str, object] = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
        "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    }
    raw.update(fields)
    return ModelConfig.model_validate(raw)


def test_instances_split_the_worker_threads_of_one_shared_session(tmp_path: Path) -> None:
    onnx_models.save(onnx_models.add_sub(), tmp_path / "model.onnx")
    backend = load_backend(onnx_config(), tmp_path, ThreadShare(4), instances=2)
    assert backend.shareable  # the worker gives every instance this one session
    options = backend.session.get_session_options()  # type: ignore[attr-defined]
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_tritons_onnxruntime_parameters_are_applied(tmp_path: Path) -> None:
    onnx_models.save(onnx_models.add_sub(), tmp_path / "model.onnx")
    config = onnx_config(
        parameters={
            "intra_op_thread_count": {"string_value": "3"},
            "inter_op_thread_count": "2",
            "execution_mode": "1",
            "enable_mem_arena": "0",
            "session.intra_op.allow_spinning": "1",
        },
        optimization={"graph": {"level": 2}},
    )
    backend = load_backend(config, tmp_path, ThreadShare(4), instances=2)
    options = backend.session.get_session_options()  # type: ignore[attr-defined]
    assert options.intra_op_num_threads == 3
    assert options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert not options.enable_cpu_mem_arena
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    x = np.ones((2, 4), np.float32)
    out = backend.infer({"INPUT0": x, "INPUT1": x})
    np.testing.assert_array_equal(out["OUTPUT0"], 2 * x)
    np.testing.assert_array_equal(out["OUTPUT1"], 0 * x)


def test_an_unavailable_cpu_accelerator_is_refused(tmp_path: Path) -> None:
    onnx_models.save(onnx_models.add_sub(), tmp_path / "model.onnx")
    accelerators = {"cpu_execution_accelerator": [{"name": "nonesuch"}]}
    config = onnx_config(optimization={"execution_accelerators": accelerators})
    with pytest.raises(ConfigError, match="'nonesuch' is not available"):
        load_backend(config, tmp_path)


def test_gpu_accelerators_are_kept_for_the_gpu_pool(tmp_path: Path) -> None:
    onnx_models.save(onnx_models.add_sub(), tmp_path / "model.onnx")
    trt = {"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}
    config = onnx_config(
        optimization={"execution_accelerators": {"gpu_execution_accelerator": [trt]}}
    )
    assert config.optimization is not None and config.optimization.execution_accelerators
    (kept,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert (kept.name, kept.parameters) == ("tensorrt", {"precision_mode": "FP16"})
    load_backend(config, tmp_path)  # the CPU pool runs it on the CPU provider


def test_an_opset_the_runtime_cannot_run_fails_the_load_naming_the_file(tmp_path: Path) -> None:
    model = onnx_models.graph_model(
        [onnx_models.helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [("INPUT0", onnx_models.TensorProto.FLOAT, ("batch", 4))],
        [("OUTPUT0", onnx_models.TensorProto.FLOAT, ("batch", 4))],
        opset=999,
    )
    path = onnx_models.save(model, tmp_path / "model.onnx")
    config = onnx_config(
        input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    )
    with pytest.raises(ConfigError, match="ONNX Runtime cannot load the model") as info:
        load_backend(config, tmp_path)
    assert str(path) in str(info.value)
    assert "opset" in str(info.value).lower()


def test_a_runtime_error_raises_from_infer_and_the_session_goes_on(tmp_path: Path) -> None:
    onnx_models.save(onnx_models.reshape_by_three(), tmp_path / "model.onnx")
    config = onnx_config(
        input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
    )
    backend = load_backend(config, tmp_path)
    with pytest.raises(Exception, match="Reshape"):
        backend.infer({"INPUT0": np.ones((1, 4), np.float32)})
    out = backend.infer({"INPUT0": np.ones((2, 3), np.float32)})["OUTPUT0"]
    assert out.shape == (2, 3)


def openvino_ir(model_dir: Path, model: object) -> Path:
    """``model`` converted by OpenVINO to ``model_dir/1/model.xml`` (+ ``.bin``)."""
    import openvino as ov

    source = onnx_models.save(model, model_dir / "source" / "model.onnx")  # type: ignore[arg-type]
    xml = model_dir / "1" / "model.xml"
    xml.parent.mkdir(parents=True)
    ov.save_model(ov.convert_model(str(source)), str(xml), compress_to_fp16=False)
    return xml


def test_openvino_streams_follow_the_instances_and_parameters_pass_through(
    tmp_path: Path,
) -> None:
    xml = openvino_ir(tmp_path, onnx_models.add_sub())
    config = onnx_config(
        backend="openvino",
        parameters={"INFERENCE_PRECISION_HINT": "f32", "NOT_A_PROPERTY": "1"},
    )
    backend = load_backend(config, xml.parent, ThreadShare(2), instances=2)
    compiled = backend.compiled  # type: ignore[attr-defined]
    assert int(compiled.get_property("NUM_STREAMS")) == 2
    assert str(compiled.get_property("INFERENCE_PRECISION_HINT")) in ("f32", "<Type: 'float32'>")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = backend.infer({"INPUT0": x, "INPUT1": x})
    np.testing.assert_array_equal(out["OUTPUT0"], 2 * x)


def test_openvino_refuses_a_cuda_device_naming_the_model(tmp_path: Path) -> None:
    from workers.backends.openvino_backend import OpenVinoBackend

    xml = openvino_ir(tmp_path, onnx_models.add_sub())
    config = onnx_config("ov_model", backend="openvino")
    with pytest.raises(
        ConfigError, match=r"^model ov_model: Weir runs OpenVINO on the CPU only"
    ) as info:
        OpenVinoBackend(config, xml.parent, device=0)
    assert "does not run on NVIDIA GPUs" in str(info.value)
    assert "KIND_CPU" in str(info.value)


def test_openvino_makes_a_fixed_batch_dimension_dynamic_when_the_config_batches(
    tmp_path: Path,
) -> None:
    xml = openvino_ir(tmp_path / "m", onnx_models.add_sub(dims=(1, 4)))
    (tmp_path / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "openvino"\nmax_batch_size: 8\n'
    )
    # The loader fills the config as the backend serves the model: batch dimension dynamic.
    config = Repository.load(tmp_path).models["m"].config
    assert config.max_batch_size == 8
    assert config.input[0].dims == (4,)
    backend = load_backend(config, xml.parent)
    x = np.ones((5, 4), np.float32)
    assert backend.infer({"INPUT0": x, "INPUT1": x})["OUTPUT1"].shape == (5, 4)


def test_openvino_reads_the_older_backends_parameter_names(tmp_path: Path) -> None:
    import openvino as ov

    from workers.backends.openvino_backend import compile_properties

    config = onnx_config(
        backend="openvino",
        parameters={"CPU_THREADS_NUM": "1", "CPU_THROUGHPUT_STREAMS": "auto", "ENFORCE_BF16": "NO"},
    )
    properties = compile_properties(ov.Core(), config, threads=2, instances=1)
    assert properties["INFERENCE_NUM_THREADS"] == "1"
    assert properties["PERFORMANCE_HINT"] == "THROUGHPUT"
    assert properties["INFERENCE_PRECISION_HINT"] == "f32"
