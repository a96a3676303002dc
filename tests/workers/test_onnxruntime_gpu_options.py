"""The ONNX Runtime backend's providers on a CUDA device: Triton's accelerator parameters as
ONNX Runtime's TensorRT and CUDA provider options, and the refusals, checked on the CPU.

The option translation is pure and needs no GPU; the load on a CUDA device is tried for real
with this machine's CPU-only onnxruntime, which must refuse it naming the fix.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import onnxruntime as ort
import pytest

from tests.weir import onnx_models
from weir.config import ModelConfig
from weir.errors import ConfigError
from weir.pbtxt import load_pbtxt
from workers.backends.onnxruntime_backend import OnnxRuntimeBackend
from workers.backends.onnxruntime_providers import gpu_provider_options, providers

TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
CPU_ONLY = pytest.mark.skipif(
    CUDA in ort.get_available_providers(), reason="this onnxruntime has the CUDA provider"
)

TENSORS = """
    name: "detector"
    backend: "onnxruntime"
    max_batch_size: 8
    input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [4] },
           { name: "INPUT1", data_type: TYPE_FP32, dims: [4] }]
    output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [4] },
            { name: "OUTPUT1", data_type: TYPE_FP32, dims: [4] }]
"""


def pbtxt_config(tmp_path: Path, extra: str = "") -> ModelConfig:
    """A Triton ``config.pbtxt`` of the add_sub model with ``extra`` appended, as Weir reads it."""
    path = tmp_path / "detector" / "config.pbtxt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(TENSORS) + textwrap.dedent(extra))
    return load_pbtxt(path, "detector")


def gpu_accelerator(name: str, **parameters: str) -> str:
    pairs = "".join(f'parameters {{ key: "{k}" value: "{v}" }}\n' for k, v in parameters.items())
    return f"""
        optimization {{ execution_accelerators {{
          gpu_execution_accelerator [{{ name: "{name}"
            {pairs} }}]
        }} }}
    """


def test_without_an_accelerator_a_device_gets_cuda_on_that_device(tmp_path: Path) -> None:
    assert gpu_provider_options(pbtxt_config(tmp_path), 0) == [(CUDA, {"device_id": "0"})]


def test_tensorrt_comes_first_with_tritons_parameters_as_its_options(tmp_path: Path) -> None:
    accelerator = gpu_accelerator(
        "tensorrt",
        precision_mode="FP16",
        max_workspace_size_bytes="1073741824",
        trt_engine_cache_enable="1",
        trt_engine_cache_path="/tmp/engines",
        minimum_segment_size="3",
        int8_use_native_calibration_table="false",
        trt_builder_optimization_level="4",
    )
    options = gpu_provider_options(pbtxt_config(tmp_path, accelerator), 1)
    assert options == [
        (
            TRT,
            {
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "True",  # the form TensorRT's Python options take
                "trt_engine_cache_path": "/tmp/engines",
                "trt_min_subgraph_size": "3",
                "trt_int8_use_native_calibration_table": "False",
                "trt_builder_optimization_level": "4",
                "device_id": "1",
            },
        ),
        (CUDA, {"device_id": "1"}),
    ]


@pytest.mark.parametrize(
    ("mode", "option"),
    [("FP32", {}), ("FP16", {"trt_fp16_enable": "True"}), ("INT8", {"trt_int8_enable": "True"})],
)
def test_precision_mode_sets_the_matching_tensorrt_switch(
    tmp_path: Path, mode: str, option: dict[str, str]
) -> None:
    config = pbtxt_config(tmp_path, gpu_accelerator("tensorrt", precision_mode=mode))
    ((name, options), _) = gpu_provider_options(config, 0)
    assert (name, options) == (TRT, {**option, "device_id": "0"})


def test_the_instances_device_wins_over_a_device_id_parameter(tmp_path: Path) -> None:
    config = pbtxt_config(tmp_path, gpu_accelerator("cuda", device_id="5"))
    assert gpu_provider_options(config, 2) == [(CUDA, {"device_id": "2"})]


def test_tritons_cuda_parameters_become_cuda_options_the_accelerators_winning(
    tmp_path: Path,
) -> None:
    model_parameters = """
        parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
        parameters { key: "gpu_mem_limit" value: { string_value: "4294967296" } }
        parameters { key: "arena_extend_strategy" value: { string_value: "1" } }
    """
    accelerator = gpu_accelerator(
        "cuda",
        arena_extend_strategy="kNextPowerOfTwo",
        do_copy_in_default_stream="true",
        cudnn_conv_use_max_workspace="0",
    )
    config = pbtxt_config(tmp_path, model_parameters + accelerator)
    assert gpu_provider_options(config, 0) == [
        (
            CUDA,
            {
                "cudnn_conv_algo_search": "HEURISTIC",  # Triton's 1
                "gpu_mem_limit": "4294967296",
                "arena_extend_strategy": "kNextPowerOfTwo",  # the accelerator's, over the 1
                "do_copy_in_default_stream": "1",
                "cudnn_conv_use_max_workspace": "0",  # passed as given: ONNX Runtime checks it
                "device_id": "0",
            },
        )
    ]


def test_on_the_cpu_the_providers_stay_the_cpus_whatever_the_gpu_accelerators(
    tmp_path: Path,
) -> None:
    config = pbtxt_config(tmp_path, gpu_accelerator("tensorrt", precision_mode="FP64"))
    assert providers(config) == [CPU]
    assert providers(config, None) == [CPU]


@pytest.mark.parametrize(
    ("accelerator", "message"),
    [
        (
            gpu_accelerator("tensorrt", precision_mode="FP64"),
            "precision_mode must be FP32, FP16, BF16, INT8, got 'FP64'",
        ),
        (
            gpu_accelerator("tensorrt", max_workspace_size_bytes="1GB"),
            "max_workspace_size_bytes must be a whole number of bytes, got '1GB'",
        ),
        (
            gpu_accelerator("tensorrt", max_workspace_size_bytes="-1"),
            "max_workspace_size_bytes must be a whole number of bytes, got '-1'",
        ),
        (
            gpu_accelerator("tensorrt", trt_engine_cache_enable="maybe"),
            "trt_engine_cache_enable must be 1, 0, true, false, on or off, got 'maybe'",
        ),
        (
            gpu_accelerator("tensorrt", max_cached_engines="4"),
            "the tensorrt accelerator has no parameter 'max_cached_engines'",
        ),
        (
            gpu_accelerator("cuda", gpu_mem_limit="lots"),
            "gpu_mem_limit must be a whole number of bytes, got 'lots'",
        ),
        (
            gpu_accelerator("cuda", cudnn_conv_algo_search="7"),
            "cudnn_conv_algo_search must be 0 or EXHAUSTIVE, 1 or HEURISTIC, 2 or DEFAULT",
        ),
        (gpu_accelerator("openvino"), "gpu_execution_accelerator 'openvino' is not one"),
    ],
)
def test_a_bad_accelerator_or_parameter_is_a_config_error_naming_the_model(
    tmp_path: Path, accelerator: str, message: str
) -> None:
    config = pbtxt_config(tmp_path, accelerator)
    with pytest.raises(ConfigError, match=r"^model detector: ") as info:
        gpu_provider_options(config, 0)
    assert message in str(info.value)


def test_a_bad_cuda_model_parameter_is_a_config_error_naming_it(tmp_path: Path) -> None:
    extra = 'parameters { key: "gpu_mem_limit" value: { string_value: "4G" } }'
    with pytest.raises(ConfigError, match="model detector: parameter gpu_mem_limit must be"):
        gpu_provider_options(pbtxt_config(tmp_path, extra), 0)


@CPU_ONLY
def test_a_cuda_device_with_cpu_only_onnxruntime_fails_the_load_naming_the_fix(
    tmp_path: Path,
) -> None:
    config = pbtxt_config(tmp_path)
    version_dir = tmp_path / "detector" / "1"
    onnx_models.save(onnx_models.add_sub(), version_dir / "model.onnx")
    with pytest.raises(ConfigError) as info:
        OnnxRuntimeBackend(config, version_dir, device=0)
    message = str(info.value)
    assert message.startswith("model detector: its instances on CUDA device 0 need " + CUDA)
    assert "(providers: " + ", ".join(ort.get_available_providers()) + ")" in message
    assert "install onnxruntime-gpu in place of onnxruntime" in message


@CPU_ONLY
def test_the_tensorrt_accelerator_is_refused_naming_its_provider(tmp_path: Path) -> None:
    config = pbtxt_config(tmp_path, gpu_accelerator("tensorrt", precision_mode="FP16"))
    with pytest.raises(ConfigError, match=f"CUDA device 3 need {TRT}, which this ONNX Runtime"):
        providers(config, 3)


@CPU_ONLY
def test_a_gpu_session_without_a_provider_it_was_given_fails_rather_than_runs_on_the_cpu(
    tmp_path: Path,
) -> None:
    # ONNX Runtime skips a provider it cannot create (here: one it lacks) with a log line and
    # runs the session on the CPU; the backend's GPU session must refuse that.
    from workers.backends.onnxruntime_backend import _gpu_session, session_options

    config = pbtxt_config(tmp_path)
    path = onnx_models.save(onnx_models.add_sub(), tmp_path / "model.onnx")
    chosen: list[str | tuple[str, dict[str, str]]] = [(CUDA, {"device_id": "0"}), CPU]
    with warnings.catch_warnings(), pytest.raises(ConfigError) as info:
        warnings.simplefilter("ignore")  # ONNX Runtime's own warning about the provider
        _gpu_session(config, path, session_options(config, 1), chosen, 0)
    assert f"ONNX Runtime could not start {CUDA} on CUDA device 0 for model detector" in str(
        info.value
    )
