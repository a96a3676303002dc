"""``triton_python_backend_utils`` for Triton Python models that Weir runs.

A Triton Python model (``model.py`` defining ``TritonPythonModel``) imports
``triton_python_backend_utils as pb_utils``; Weir puts this module under that name before
it loads one (:mod:`workers.backends.triton_python`). It offers what such models use to read
requests and answer them: :class:`Tensor`, :class:`InferenceRequest` (the requests
``execute`` gets), :class:`InferenceResponse`, :class:`TritonError`,
:class:`TritonModelException`, ``get_input_tensor_by_name``, ``get_output_tensor_by_name``,
``get_input_config_by_name``, ``get_output_config_by_name``, ``triton_string_to_numpy``,
``numpy_to_triton_type``, :class:`Logger` and the flag constants, and :class:`ModelConfig`
for ``auto_complete_config``. A model calls another
from ``execute`` with ``InferenceRequest(model_name=..., ...).exec()`` or ``async_exec()``
(Triton's BLS, through the worker's :mod:`workers.bls`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from weir import datatypes
from workers.backends.pb_model_config import ModelConfig as ModelConfig  # Triton's name

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
    """A request: one of an ``execute`` call's, or one a model makes to call another (BLS)."""

    def __init__(
        self,
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        request_id: str = "",
        parameters: dict[str, Any] | str | None = None,
        is_cancelled: Callable[[], bool] | None = None,
        *,
        model_name: str = "",
        model_version: int | str = -1,
        timeout: int = 0,
        correlation_id: int | str = 0,
        flags: int = 0,
        **_: Any,
    ) -> None:
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._id = request_id
        raw = parameters or {}
        self._parameters = raw if isinstance(raw, str) else json.dumps(raw)
        self._is_cancelled = is_cancelled or (lambda: False)
        self._model = model_name
        self._version = "" if model_version in (-1, "-1", "") else str(model_version)
        self._timeout_us = timeout
        self._correlation_id = correlation_id  # a sequence model's request (its sequence id)
        self._flags = flags  # and its TRITONSERVER_REQUEST_FLAG_SEQUENCE_* bits
        self.response_sender: Any = None  # a decoupled model's (workers.backends.triton_senders)

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._outputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def parameters(self) -> str:
        """The request's parameters, as a JSON object's text (Triton's form)."""
        return self._parameters

    def timeout(self) -> int:
        return self._timeout_us

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

    def exec(self, decoupled: bool = False) -> Any:
        """Call the model this request names and wait for its response (Triton's BLS).

        ``decoupled=True``: a :class:`ResponseIterator` of its responses, as they come.
        """
        client, call = self._call()
        if decoupled:
            return ResponseIterator(client.call_decoupled(call))
        return _response(client.call(call))

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for an ``async def execute``: other calls go on while it waits."""
        import asyncio

        client, call = self._call()
        if client.loop is None:
            raise TritonModelException("this worker cannot call other models yet: it is starting")
        if decoupled:
            stream = client.new_stream(call)
            sent = asyncio.run_coroutine_threadsafe(client.astream(stream), client.loop)
            await asyncio.wrap_future(sent)
            return ResponseIterator(stream)
        running = asyncio.run_coroutine_threadsafe(client.acall(call), client.loop)
        return _response(await asyncio.wrap_future(running))

    def _call(self) -> tuple[Any, Any]:
        from weir.tensors import Tensor as WireTensor
        from workers import batch_wait, bls

        client = bls.CLIENT
        if client is None:
            raise TritonModelException("calling other models needs a Weir worker")
        inputs = {t.name(): WireTensor.from_numpy(t.as_numpy()) for t in self._inputs}
        left_s = min(batch_wait.time_left_s(), client.default_timeout_s)
        timeout_s = self._timeout_us / 1e6 if self._timeout_us else left_s
        return client, bls.ModelCall(self._model, self._version, inputs, self._outputs, timeout_s)


_CODES = {
    "invalid": TritonError.INVALID_ARG,
    "not_found": TritonError.NOT_FOUND,
    "unavailable": TritonError.UNAVAILABLE,
    "unsupported": TritonError.UNSUPPORTED,
    "canceled": TritonError.CANCELLED,
}


def _response(reply: Any) -> InferenceResponse:
    """A called model's reply as the response ``exec()`` returns."""
    if reply.error is not None:
        kind, message = reply.error
        return InferenceResponse(error=TritonError(message, _CODES.get(kind, TritonError.INTERNAL)))
    tensors = [Tensor(name, t.to_numpy()) for name, t in reply.outputs.items()]
    return InferenceResponse(output_tensors=tensors)


class ResponseIterator:
    """A decoupled call's responses (``exec(decoupled=True)``), each as it comes.

    The called model's responses, then a last one that ends the call: empty when the model
    sent all its responses before its final flag (Triton's decoupled models), the answer of
    a model that is not decoupled, or the error that ended the call.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream  # a workers.bls.CallStream

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> InferenceResponse:
        reply = self._stream.next()
        if reply is None:
            raise StopIteration
        return _response(reply)

    def cancel(self) -> None:
        """No more responses are wanted: the called model's ``is_cancelled()`` says so."""
        self._stream.cancel()


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
