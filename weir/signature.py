"""A model file's own signature: its inputs and outputs, read without running it.

Triton's auto-complete fills a config from the model; Weir does the same in the repository
loader, which the gateway and the batcher run too, so a signature is read straight from the
file (:mod:`weir.onnx_file`, :mod:`weir.openvino_file`) with no runtime installed: the gateway
image carries neither ONNX Runtime nor OpenVINO.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weir.errors import ConfigError


@dataclass(frozen=True, slots=True)
class TensorSignature:
    """One input or output as the model declares it.

    ``datatype`` is the KServe name (``FP32``, ``BYTES``...) or, where KServe has none, the
    runtime's own name in angle brackets (``<complex64>``). ``dims`` holds -1 for a
    dynamic dimension; ``None`` when the model does not say its rank.
    """

    name: str
    datatype: str
    dims: tuple[int, ...] | None

    def describe_dims(self) -> str:
        return "unknown rank" if self.dims is None else str(list(self.dims))


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a model file takes and returns, in the model's order."""

    path: Path
    inputs: tuple[TensorSignature, ...]
    outputs: tuple[TensorSignature, ...]

    def with_dynamic_batch(self) -> ModelSignature:
        """This signature with every tensor's first dimension dynamic (a reshape does it)."""

        def dynamic(t: TensorSignature) -> TensorSignature:
            if not t.dims:
                return t
            return TensorSignature(t.name, t.datatype, (-1, *t.dims[1:]))

        return ModelSignature(
            self.path, tuple(map(dynamic, self.inputs)), tuple(map(dynamic, self.outputs))
        )

    def supports_batching(self) -> bool:
        """Triton's rule: every input and output has a dynamic first dimension."""
        return all(t.dims is not None and t.dims[:1] == (-1,) for t in self.inputs + self.outputs)


def unsupported_type(path: Path, tensor: str, runtime_type: str) -> ConfigError:
    return ConfigError(f"{path}: tensor {tensor!r} has type {runtime_type}, which KServe lacks")
