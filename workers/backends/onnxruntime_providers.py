"""The execution providers of an ONNX Runtime session, from Triton's execution accelerators.

:func:`providers` gives a session its providers, in order. On the CPU: ONNX Runtime's CPU
provider, OpenVINO's first when ``cpu_execution_accelerator`` names ``openvino`` and that
provider is installed. On a CUDA device (an index among the devices the worker sees), as
Triton's onnxruntime backend orders them: TensorRT's provider when
``gpu_execution_accelerator`` names ``tensorrt``, then CUDA's, then the CPU's for what neither
runs; each of the GPU ones must be in this ONNX Runtime (onnxruntime-gpu, in place of
onnxruntime). :func:`gpu_provider_options` turns Triton's parameters into those providers'
options, ``device_id`` always the instance's device:

- ``tensorrt``: ``precision_mode`` FP32 (the default), FP16, BF16 or INT8 sets
  ``trt_fp16_enable`` / ``trt_bf16_enable`` / ``trt_int8_enable``; ``max_workspace_size_bytes``
  is ``trt_max_workspace_size``; ``int8_calibration_table_name`` and
  ``int8_use_native_calibration_table`` gain the ``trt_`` prefix; the ``trt_*`` parameters of
  Triton's table (``trt_engine_cache_enable``, ``trt_engine_cache_path``,
  ``trt_min_subgraph_size``...) keep their names; TF-TRT's ``minimum_segment_size`` is read as
  ``trt_min_subgraph_size``. Any other name is refused, as Triton refuses it (TF-TRT's
  ``max_cached_engines`` has no ONNX Runtime counterpart). Switches take 1/0, true/false,
  on/off, and reach the provider as True/False, the form its Python options take.
- ``cuda``: each parameter is the CUDA provider option of that name (ONNX Runtime refuses a
  name it lacks, at load). ``gpu_mem_limit`` is a byte count; ``cudnn_conv_algo_search`` and
  ``arena_extend_strategy`` take ONNX Runtime's names or Triton's numbers (0 EXHAUSTIVE,
  1 HEURISTIC, 2 DEFAULT; 0 kNextPowerOfTwo, 1 kSameAsRequested). The model parameters Triton
  still reads for these (``cudnn_conv_algo_search``, ``gpu_mem_limit``,
  ``arena_extend_strategy``, ``do_copy_in_default_stream``) apply too; the accelerator's win.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

import onnxruntime as ort

from weir.config import ModelConfig
from weir.config_optimization import Accelerator
from weir.errors import ConfigError

logger = logging.getLogger(__name__)

CPU_ACCELERATORS = {"openvino": "OpenVINOExecutionProvider"}
TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
GPU_FIX = (
    "install onnxruntime-gpu in place of onnxruntime (pip uninstall onnxruntime; "
    "pip install onnxruntime-gpu); the weir-cuda image has it"
)

Provider = str | tuple[str, dict[str, str]]
Parse = Callable[[str], str]


def _bytes(raw: str) -> str:
    if not re.fullmatch(r"[0-9]+", raw):
        raise ValueError("must be a whole number of bytes")
    return raw


def _whole(raw: str) -> str:
    if not re.fullmatch(r"-?[0-9]+", raw):
        raise ValueError("must be a whole number")
    return raw


def _switch(raw: str) -> bool:
    """A Triton switch: 1/true/on or 0/false/off, in any case."""
    value = raw.lower()
    if value not in ("1", "true", "on", "0", "false", "off"):
        raise ValueError("must be 1, 0, true, false, on or off")
    return value in ("1", "true", "on")


def _trt_switch(raw: str) -> str:
    # The TensorRT provider's Python options take True or False only (not 1 or 0).
    return "True" if _switch(raw) else "False"


def _cuda_switch(raw: str) -> str:
    return "1" if _switch(raw) else "0"


def _text(raw: str) -> str:
    if not raw:
        raise ValueError("must not be empty")
    return raw


def _choice(names: tuple[str, ...]) -> Parse:
    """An ONNX Runtime enum option: one of ``names``, or its index (Triton's numbers)."""

    def parse(raw: str) -> str:
        if raw in names:
            return raw
        if raw.isdigit() and int(raw) < len(names):
            return names[int(raw)]
        listed = ", ".join(f"{i} or {name}" for i, name in enumerate(names))
        raise ValueError(f"must be {listed}")

    return parse


# Triton's tensorrt accelerator parameters (its onnxruntime backend's README and source)
# -> the TensorRT provider's option and how its value is read; precision_mode is apart.
TRT_PARAMETERS: dict[str, tuple[str, Parse]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", _bytes),
    "minimum_segment_size": ("trt_min_subgraph_size", _whole),  # TF-TRT's name
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", _text),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", _trt_switch),
    **{
        name: (name, _whole)
        for name in (
            "trt_max_partition_iterations",
            "trt_min_subgraph_size",
            "trt_dla_core",
            "trt_builder_optimization_level",
            "trt_auxiliary_streams",
            "trt_ep_context_embed_mode",
        )
    },
    **{
        name: (name, _trt_switch)
        for name in (
            "trt_dla_enable",
            "trt_engine_cache_enable",
            "trt_dump_subgraphs",
            "trt_force_sequential_engine_build",
            "trt_context_memory_sharing_enable",
            "trt_layer_norm_fp32_fallback",
            "trt_timing_cache_enable",
            "trt_force_timing_cache",
            "trt_detailed_build_log",
            "trt_build_heuristics_enable",
            "trt_sparsity_enable",
            "trt_cuda_graph_enable",
            "trt_dump_ep_context_model",
        )
    },
    **{
        name: (name, _text)
        for name in (
            "trt_engine_cache_path",
            "trt_engine_cache_prefix",
            "trt_timing_cache_path",
            "trt_tactic_sources",
            "trt_extra_plugin_lib_paths",
            "trt_profile_min_shapes",
            "trt_profile_max_shapes",
            "trt_profile_opt_shapes",
            "trt_ep_context_file_path",
        )
    },
}
PRECISION_MODES = {
    "FP32": None,
    "FP16": "trt_fp16_enable",
    "BF16": "trt_bf16_enable",
    "INT8": "trt_int8_enable",
}
# CUDA provider options whose values Weir reads (any other passes as given, to ONNX Runtime).
CUDA_VALUES: dict[str, Parse] = {
    "gpu_mem_limit": _bytes,
    "cudnn_conv_algo_search": _choice(("EXHAUSTIVE", "HEURISTIC", "DEFAULT")),
    "arena_extend_strategy": _choice(("kNextPowerOfTwo", "kSameAsRequested")),
    "do_copy_in_default_stream": _cuda_switch,
    "use_ep_level_unified_stream": _cuda_switch,
}
# Model parameters Triton reads as CUDA provider options (before its ``cuda`` accelerator).
CUDA_MODEL_PARAMETERS = (
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
)


def providers(config: ModelConfig, device: int | None = None) -> list[Provider]:
    """The execution providers of an instance on the CPU (``device`` None) or a CUDA device.

    On a device, each provider the options name must be in this ONNX Runtime: else
    ConfigError naming the model, the provider, the providers it has and the fix.
    """
    if device is None:
        return [*_cpu_providers(config)]
    chosen = gpu_provider_options(config, device)
    available = ort.get_available_providers()
    for name, _ in chosen:
        if name not in available:
            raise ConfigError(
                f"model {config.name}: its instances on CUDA device {device} need {name}, which "
                f"this ONNX Runtime lacks (providers: {', '.join(available)}); {GPU_FIX}"
            )
    if _accelerators(config, "cpu"):
        logger.info("model %s: cpu_execution_accelerator applies on the CPU pool", config.name)
    return [*chosen, CPU]


def gpu_provider_options(config: ModelConfig, device: int) -> list[tuple[str, dict[str, str]]]:
    """The GPU providers of an instance on CUDA device ``device``, with their options.

    TensorRT's when ``gpu_execution_accelerator`` names ``tensorrt``, then CUDA's. Pure: it
    asks ONNX Runtime nothing. An unknown accelerator or parameter, or a value its option
    cannot take, raises ConfigError naming the model.
    """
    model_parameters = {k: v for k, v in config.parameters.items() if k in CUDA_MODEL_PARAMETERS}
    cuda = _cuda_options(config, "parameter", model_parameters)
    tensorrt: dict[str, str] | None = None
    for accelerator in _accelerators(config, "gpu"):
        if accelerator.name == "tensorrt":
            tensorrt = _tensorrt_options(config, accelerator.parameters)
        elif accelerator.name == "cuda":
            cuda.update(_cuda_options(config, "cuda accelerator parameter", accelerator.parameters))
        else:
            raise ConfigError(
                f"model {config.name}: gpu_execution_accelerator {accelerator.name!r} is not "
                "one the ONNX Runtime backend knows (tensorrt, cuda)"
            )
    device_id = {"device_id": str(device)}  # last: the instance's device wins over a parameter
    first = [] if tensorrt is None else [(TENSORRT, {**tensorrt, **device_id})]
    return [*first, (CUDA, {**cuda, **device_id})]


def _cpu_providers(config: ModelConfig) -> list[str]:
    """The execution providers of a CPU instance, the config's accelerators first."""
    chosen: list[str] = []
    accelerators = config.optimization.execution_accelerators if config.optimization else None
    available = ort.get_available_providers()
    for accelerator in accelerators.cpu_execution_accelerator if accelerators else ():
        provider = CPU_ACCELERATORS.get(accelerator.name)
        if provider is None or provider not in available:
            raise ConfigError(
                f"model {config.name}: cpu_execution_accelerator {accelerator.name!r} is not "
                f"available in this ONNX Runtime (providers: {', '.join(available)})"
            )
        chosen.append(provider)
    if accelerators and accelerators.gpu_execution_accelerator:
        logger.info("model %s: gpu_execution_accelerator applies on the GPU pool", config.name)
    return [*chosen, CPU]


def _accelerators(config: ModelConfig, kind: str) -> tuple[Accelerator, ...]:
    accelerators = config.optimization.execution_accelerators if config.optimization else None
    if accelerators is None:
        return ()
    if kind == "gpu":
        return accelerators.gpu_execution_accelerator
    return accelerators.cpu_execution_accelerator


def _tensorrt_options(config: ModelConfig, parameters: Mapping[str, str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, raw in parameters.items():
        if key == "precision_mode":
            options.update(_precision(config, raw))
            continue
        if key not in TRT_PARAMETERS:
            raise ConfigError(
                f"model {config.name}: the tensorrt accelerator has no parameter {key!r} "
                f"(it takes precision_mode, {', '.join(sorted(TRT_PARAMETERS))})"
            )
        option, parse = TRT_PARAMETERS[key]
        options[option] = _parsed(config, "tensorrt accelerator parameter", key, raw, parse)
    return options


def _precision(config: ModelConfig, raw: str) -> dict[str, str]:
    if raw not in PRECISION_MODES:
        raise ConfigError(
            f"model {config.name}: tensorrt accelerator parameter precision_mode must be "
            f"{', '.join(PRECISION_MODES)}, got {raw!r}"
        )
    option = PRECISION_MODES[raw]
    return {} if option is None else {option: "True"}


def _cuda_options(config: ModelConfig, where: str, parameters: Mapping[str, str]) -> dict[str, str]:
    return {
        key: _parsed(config, where, key, raw, CUDA_VALUES.get(key, _text))
        for key, raw in parameters.items()
    }


def _parsed(config: ModelConfig, where: str, key: str, raw: str, parse: Parse) -> str:
    try:
        return parse(raw)
    except ValueError as exc:
        raise ConfigError(f"model {config.name}: {where} {key} {exc}, got {raw!r}") from None
