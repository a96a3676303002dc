"""``triton_python_backend_utils`` for Triton Python models that Weir runs.

A Triton Python model (``model.py`` defining ``TritonPythonModel``) imports
``triton_python_backend_utils as pb_utils``; Weir puts this module under that name before
it loads one (:mod:`workers.backends.triton_python`). It offers what such models use to read
requests and answer them: :class:`Tensor`, :class:`InferenceRequest` (the requests
``execute`` gets), :class:`InferenceResponse`, :class:`TritonError`,
:class:`TritonModelException`, ``get_input_tensor_by_name``, ``get_output_tensor_by_name``,
``get_input_config_by_name``, ``get_output_config_by_name``, ``triton_string_to_numpy``,
``numpy_to_triton_type``, :class:`Logger` and the flag constants. A Triton Python model
that calls other models from ``execute`` (``InferenceRequest(...).exec()``, Triton's BLS)
gets :class:`TritonModelException` saying so: the mesh runs pipelines as ensembles instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from weir import datatypes

logger = logging.getLogger("triton_python_model")

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class TritonModelException(Exception):
    """What a model raises from ``execute`` to fail every request of the call."""


class TritonError:
    """An error a response carries, with Triton's codes."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Tensor:
    """A named tensor, held as a numpy array on the CPU."""

    def __init__(self, name: str, array: Any) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def is_cpu(self) -> bool:
        return True

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> str:
        return datatypes.datatype_of(self._array)

    def to_dlpack(self) -> Any:
        return self._array.__dlpack__()

    @classmethod
    def from_dlpack(cls, name: str, capsule: Any) -> Tensor:
        return cls(name, np.from_dlpack(capsule))


class InferenceRequest:
    """One request of an ``execute`` call: its inputs, wanted outputs and parameters."""

    def __init__(
        self,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        request_id: str = "",
        parameters: dict[str, Any] | str | None = None,
        is_cancelled: Callable[[], bool] | None = None,
        **bls: Any,
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._id = request_id
        raw = parameters or {}
        self._parameters = raw if isinstance(raw, str) else json.dumps(raw)
        self._is_cancelled = is_cancelled or (lambda: False)
        self._model = bls.get("model_name")
        self.response_sender: Any = None  # a decoupled model's (workers.backends.triton_senders)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int:
        return 0

    def flags(self) -> int:
        return 0

    def parameters(self) -> str:
        """The request's parameters, as a JSON object's text (Triton's form)."""
        return self._parameters

    def timeout(self) -> int:
        return 0

    def is_cancelled(self) -> bool:
        return self._is_cancelled()

    def set_release_flags(self, flags: int) -> None:
        if flags & TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException("Weir does not reschedule requests")

    def get_response_sender(self) -> Any:
        if self.response_sender is None:
            raise TritonModelException(
                "only a decoupled model (model_transaction_policy { decoupled: true }) has a "
                "response sender"
            )
        return self.response_sender

    def exec(self, *args: Any, **kwargs: Any) -> Any:
        raise TritonModelException(
            f"calling model '{self._model}' from a Python model (Triton's BLS) is not served "
            "by Weir: run the models as a pipeline (an ensemble) instead"
        )

    async_exec = exec


class InferenceResponse:
    """The answer to one request: its output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors)
        self._error = error
        self._parameters = parameters

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((i for i in model_config.get("input", ()) if i.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((o for o in model_config.get("output", ()) if o.get("name") == name), None)


def triton_string_to_numpy(triton_type: str) -> Any:
    """The numpy type of a config datatype (``TYPE_FP32``) or protocol one (``FP32``)."""
    name = datatypes.CONFIG_TO_PROTOCOL.get(triton_type, triton_type)
    return object if name == datatypes.BYTES else datatypes.numpy_dtype(name).type


def numpy_to_triton_type(dtype: Any) -> str:
    return datatypes.PROTOCOL_TO_CONFIG[datatypes.datatype_of(np.empty(0, dtype=dtype))]


class Logger:
    """Triton's model logger: to the worker's log."""

    @staticmethod
    def log_info(message: str) -> None:
        logger.info(message)

    @staticmethod
    def log_warn(message: str) -> None:
        logger.warning(message)

    @staticmethod
    def log_error(message: str) -> None:
        logger.error(message)

    @staticmethod
    def log_verbose(message: str) -> None:
        logger.debug(message)

    @staticmethod
    def log(message: str, level: int = 0) -> None:
        logger.info(message)
