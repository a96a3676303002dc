"""TorchServe's handler API, served by Weir: the context, the request dicts, the answers.

A TorchServe handler runs unchanged against these objects: :class:`Context` offers what
``ts.context.Context`` offers (``model_name``, ``manifest``, ``system_properties``,
``model_yaml_config``, ``metrics``, ``request_ids``, the request headers and the response
status and headers of each request of a batch), so a custom handler needs no ``ts``
package. Where Weir differs:

- :meth:`Context.get_request_header` falls back to a case-insensitive match when the exact
  name is absent (TorchServe's lookup is exact). Weir's gateway may hand header names
  lower-cased, as HTTP/2 does, and a handler asking for ``Content-Type`` still finds it.
- ``context.metrics`` is :class:`~workers.backends.torchserve_metrics.HandlerMetrics`:
  what a handler records reaches the metrics port (:mod:`weir.handler_metrics`).
- ``cl_socket`` is where ``send_intermediate_predict_response`` writes what a handler
  streams: the backend puts a :class:`~workers.backends.torchserve_stream.PartSocket` there.
- The sequence headers keep TorchServe's default names.

:func:`handler_inputs` turns a batch's ``body`` or ``ts_request`` elements into the dicts
TorchServe's backend hands the handler, decoding each parameter by its content type unless
decoding is off (TorchServe's ``decode_input_request``; a raw ``body`` is the parameter
``body`` with no content type: a bytearray); :func:`serialize`
turns one element of the handler's answer into bytes as TorchServe's
``create_predict_response`` does.
"""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from weir.errors import InvalidInput
from weir.torchserve import envelope
from weir.torchserve.envelope import TsRequest
from workers.backends.torchserve_metrics import HandlerMetrics

logger = logging.getLogger(__name__)

CONTENT_TYPE = "content-type"
JSON_TYPE = "application/json"
# TorchServe's default sequence header names (its TS_REQUEST_SEQUENCE_* variables rename them).
SEQUENCE_ID = "ts_request_sequence_id"
SEQUENCE_START = "ts_request_sequence_start"
SEQUENCE_END = "ts_request_sequence_end"


class RequestState:
    """One request of a batch: its headers in, its status and headers out.

    TorchServe's ``RequestProcessor``; handlers reach it as ``context.request_processor[i]``.
    """

    def __init__(self, request_headers: dict[str, Any]) -> None:
        self._request_headers = request_headers
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_headers: dict[str, str] = {}

    def get_request_property(self, key: str) -> Any:
        """A request header (or a parameter's ``{"content-type": ...}``), any case."""
        if key in self._request_headers:
            return self._request_headers[key]
        lowered = key.lower()
        return next((v for k, v in self._request_headers.items() if k.lower() == lowered), None)

    def get_request_properties(self) -> dict[str, Any]:
        return self._request_headers

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = code
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_headers[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_headers

    def get_response_header(self, key: str) -> str | None:
        return self._response_headers.get(key)


class Context:
    """What a TorchServe handler's ``initialize(context)`` and ``handle(data, context)`` get."""

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any],
        batch_size: int,
        gpu_id: int | None,
        server_version: str,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu_id,
            "batch_size": batch_size,
            "server_name": "Weir",
            "server_version": server_version,
            "limit_max_image_pixels": True,
        }
        self.request_ids: dict[int, str] | None = None
        self.request_processor: list[RequestState] = []
        self.metrics = HandlerMetrics(model_name)
        self.model_yaml_config = model_yaml_config or {}
        self.stopping_criteria: Any = None
        self.cl_socket: Any = None
        self.header_key_sequence_id = SEQUENCE_ID
        self.header_key_sequence_start = SEQUENCE_START
        self.header_key_sequence_end = SEQUENCE_END

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    def begin_batch(self, request_ids: list[str], states: list[RequestState]) -> None:
        """Point the context at a new batch, as TorchServe does before calling ``handle``."""
        self.request_ids = dict(enumerate(request_ids))
        self.request_processor = states
        self.metrics.set_request_ids(self.request_ids)

    def get_request_id(self, idx: int = 0) -> str | None:
        return None if self.request_ids is None else self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> Any:
        return self.request_processor[idx].get_request_property(key)

    def get_all_request_header(self, idx: int) -> dict[str, Any]:
        return self.request_processor[idx].get_request_properties()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, CONTENT_TYPE, value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.get_response_headers(idx).get(CONTENT_TYPE)

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        state = self.request_processor[idx]
        return state.get_response_status_code(), state.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if self.request_processor:  # as TorchServe: no batch yet (initialize), nothing to set
            self.request_processor[idx].report_status(code, reason_phrase=phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for state in self.request_processor:
            state.report_status(code, reason_phrase=phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.request_processor[idx].add_response_property(key, value)

    def get_sequence_id(self, idx: int) -> Any:
        return self.request_processor[idx].get_request_property(self.header_key_sequence_id)


def decode_value(content_type: str, value: bytes) -> Any:
    """A parameter's value as TorchServe's backend decodes it.

    ``application/json``: the parsed JSON; ``text/*``: a str; else (or when that decoding
    fails) a bytearray.
    """
    try:
        if content_type == JSON_TYPE:
            try:
                return orjson.loads(value)  # the same values as json's, several times faster
            except orjson.JSONDecodeError:
                # What orjson refuses and json takes: NaN and Infinity, integers past 64
                # bits, nesting past 1024 levels.
                return json.loads(value.decode("utf-8"))
        if content_type.startswith("text"):
            return value.decode("utf-8")
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError; deep JSON
        logger.warning("failed to decode a %s input; the handler gets its bytes", content_type)
    return bytearray(value)


def handler_inputs(
    model: str, inputs: Mapping[str, np.ndarray], decode: bool = True
) -> tuple[list[dict[str, Any]], list[RequestState]]:
    """The ``data`` a handler's ``handle`` gets for a batch, and each request's state.

    ``decode``: JSON and text values decoded (:func:`decode_value`), else bytearrays.
    """
    pairs = [handler_input(request, decode) for request in read_requests(model, inputs)]
    return [data for data, _ in pairs], [state for _, state in pairs]


def read_requests(model: str, inputs: Mapping[str, np.ndarray]) -> list[envelope.TsRequest]:
    """The batch's requests: each from its ``ts_request`` element or its raw ``body``."""
    packed, bodies = inputs.get(envelope.TS_REQUEST), inputs.get(envelope.BODY)
    if packed is not None and bodies is not None:
        raise InvalidInput(f"model '{model}': a request carries body or ts_request, not both")
    if packed is not None:
        try:
            return [envelope.unpack_request(_raw(e)) for e in packed.reshape(-1)]
        except ValueError as exc:
            raise InvalidInput(f"model '{model}': {exc}") from None
    if bodies is not None:
        return [
            envelope.TsRequest([envelope.Parameter(envelope.BODY, "", _raw(e))])
            for e in bodies.reshape(-1)
        ]
    raise InvalidInput(f"model '{model}': a request needs the input body or ts_request")


def _raw(element: Any) -> bytes:
    return element.encode("utf-8") if isinstance(element, str) else bytes(element)


def handler_input(request: TsRequest, decode: bool = True) -> tuple[dict[str, Any], RequestState]:
    """One request's element of ``data`` and its :class:`RequestState`.

    The request headers hold, as TorchServe's, ``{name: {"content-type": ...}}`` for each
    parameter and then the request's own headers.
    """
    data: dict[str, Any] = {}
    headers: dict[str, Any] = {}
    for parameter in request.parameters:
        value = parameter.value
        data[parameter.name] = (
            decode_value(parameter.content_type, value) if decode else bytearray(value)
        )
        headers[parameter.name] = {CONTENT_TYPE: parameter.content_type}
    headers.update(request.headers)
    return data, RequestState(headers)


def serialize(value: Any) -> tuple[bytes, bool]:
    """One answer as TorchServe sends it, and whether it was serialized as JSON.

    bytes as they are, a str in UTF-8, a torch tensor by ``torch.save``, anything else as
    indented JSON; what JSON cannot hold raises :class:`TypeError` or :class:`ValueError`.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), False
    if isinstance(value, str):
        return value.encode("utf-8"), False
    torch = sys.modules.get("torch")  # a tensor means torch is imported; never import it here
    if torch is not None and isinstance(value, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue(), False
    return json.dumps(value, indent=2).encode("utf-8"), True


def response_headers(state: RequestState, as_json: bool) -> dict[str, str]:
    """The headers of one answer: those the handler set, with a JSON answer's type.

    TorchServe sends no content type unless the handler set one; Weir names JSON it wrote.
    """
    headers = {str(k): str(v) for k, v in state.get_response_headers().items()}
    if as_json and not _has_key(headers, CONTENT_TYPE):
        headers[CONTENT_TYPE] = JSON_TYPE
    return headers


def _has_key(headers: Mapping[str, str], key: str) -> bool:
    return any(k.lower() == key for k in headers)
