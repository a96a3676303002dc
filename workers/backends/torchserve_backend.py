"""TorchServe backend: a model archive (``.mar``) whose handler runs unchanged.

Loading follows TorchServe's model loader. The archive (``<version>/model.mar``: a zip, a
tgz or a directory) is unpacked once into the archive cache and the manifest's ``handler``
is imported: ``x.py``, ``x`` or ``x:function`` names a file of the archive, any other name a
built-in handler of ``ts.torch_handler`` (``base_handler``, ``image_classifier``...). A
module with the function (``handle`` by default) is a function entry point, initialized by
``handle(None, context)``; otherwise the one class the module defines is built with no
arguments, ``initialize(context)`` is called, and ``handle(data, context)`` runs each batch.
A handler that subclasses ``BaseHandler``, and every built-in, needs TorchServe's ``ts``
package (Weir's ``torchserve`` extra); the context and the rest of the server side are
Weir's own (:mod:`workers.backends.torchserve_context`).

TorchServe runs one process per model, with the model directory on ``PYTHONPATH`` and as the
working directory. A Weir worker runs many models in one process, so:

- The handler is imported under a module name of its own, with the unpacked directory first
  on ``sys.path`` while it is imported and initialized (one such load at a time in the
  process, so a slow ``initialize`` holds back other archives' loads). Afterwards the
  modules loaded from that directory leave ``sys.modules`` (the handler keeps them alive),
  so two archives that both ship ``utils.py`` never see each other's. The archive's modules
  must therefore be imported at load time (at module level or in ``initialize``): an
  ``import`` of one inside ``handle`` is not found. A name already imported from elsewhere
  wins over the archive's module, as in TorchServe (it is logged).
- The working directory is not changed (it is the process's, shared by every model):
  a handler must open its files by ``context.system_properties["model_dir"]``, as
  TorchServe's handlers do, not by a relative path.
- ``system_properties["gpu_id"]`` is the index of the CUDA device the instance runs on
  (among those the worker sees, :mod:`workers.placement`), or None on the CPU: TorchServe's
  handlers put their model on ``cuda:<gpu_id>`` when it is set and CUDA is available.
- The archive's ``requirements.txt`` is installed only when the worker allows it
  (:mod:`workers.backends.torchserve_requirements`); otherwise it is said once, at info.
- JSON and text inputs reach the handler decoded unless the worker's
  ``ts_decode_input_request`` (TorchServe's ``decode_input_request``) is false, or the
  handler set ``TS_DECODE_INPUT_REQUEST`` as it loaded (then that value, for this archive
  alone: TorchServe's backend reads the variable for each request of its one model).

Each batch holds ``body`` (a raw body: ``{"body": bytearray}``) or ``ts_request`` (a whole
TorchServe request, :mod:`weir.torchserve.envelope`) per request; ``handle`` gets one dict per
request and must return a list of as many answers. Errors keep TorchServe's meaning: a
``PredictionException`` answers with its message and the error kind of its code (400, 404,
413, 503, 504; any other code 500), ``MemoryError`` is "Out of resources" (500, TorchServe's
507), anything else "Prediction failed" (503), named here with the model and the exception;
the traceback goes to the log. What ``handle`` streams before it returns
(``send_intermediate_predict_response``) reaches each request at once
(:mod:`workers.backends.torchserve_stream`).
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

import weir
from weir.autocomplete import model_path
from weir.config import ModelConfig
from weir.errors import (
    BodyTooLarge,
    ConfigError,
    DeadlineExceeded,
    InvalidInput,
    NotFound,
    ServerError,
    Unavailable,
    WeirError,
)
from weir.handler_metrics import HandlerSample
from weir.torchserve import archive, envelope
from workers.backends import ArchiveOptions
from workers.backends.base import ModelBackend
from workers.backends.torchserve_context import (
    Context,
    RequestState,
    handler_inputs,
    response_headers,
    serialize,
)
from workers.backends.torchserve_loader import HandlerLoader
from workers.backends.torchserve_stream import PartSocket

logger = logging.getLogger(__name__)

ERRORS_BY_CODE: dict[int, type[WeirError]] = {
    400: InvalidInput,
    404: NotFound,
    413: BodyTooLarge,
    503: Unavailable,
    504: DeadlineExceeded,
}
PREDICTION_METRIC = "PredictionTime"
STREAM_NEXT = "ts_stream_next"  # "true" on a streamed part, "false" on the answer after them


class TorchServeBackend(ModelBackend):
    """One instance of a TorchServe archive's handler, on the CPU or CUDA device ``device``."""

    shareable = False  # a handler object serves one batch at a time

    def __init__(
        self,
        config: ModelConfig,
        version_dir: Path,
        options: ArchiveOptions | None = None,
        device: int | None = None,
    ) -> None:
        options = options or ArchiveOptions()
        self.config = config
        self.device = device
        self.batches = config.max_batch_size > 0
        self.path = model_path(config, version_dir)
        self.model_dir = _unpack(self.path)
        self.manifest = archive.read_manifest(self.model_dir)
        self.context = Context(
            config.name,
            str(self.model_dir),
            self.manifest.raw,
            max(config.max_batch_size, 1),  # TorchServe's batch_size is 1 without batching
            device,  # gpu_id: None on the CPU
            weir.__version__,
            archive.read_model_config(self.model_dir),
        )
        self.context.cl_socket = PartSocket(config.name, self.context, self.batches)
        loader = HandlerLoader(
            config.name, self.path, self.model_dir, self.manifest, options.install_requirements
        )
        self.entry_point = loader.load(self.context)
        chosen = loader.decode_input  # the handler's own choice, if it made one
        self.decode = options.decode_input_request if chosen is None else chosen

    def handler_samples(self) -> list[HandlerSample]:
        return self.context.metrics.samples()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        data, states = handler_inputs(self.config.name, inputs, self.decode)
        self.context.begin_batch([str(uuid.uuid4()) for _ in data], states)
        results = self._handle(data)
        return self._answers(results, states)

    def _handle(self, data: list[dict[str, Any]]) -> list[Any]:
        started = time.monotonic()
        try:
            results = self.entry_point.handle(data, self.context)
        except WeirError:
            raise
        except Exception as exc:
            raise self._failure(exc) from exc
        name = self.config.name
        if not isinstance(results, list):
            raise ServerError(
                f"model '{name}': Invalid model predict output: handle returned "
                f"{type(results).__name__}, expected a list of {len(data)}"
            )
        if len(results) != len(data):
            raise ServerError(
                f"model '{name}': number of batch response mismatched, "
                f"expect: {len(data)}, got: {len(results)}"
            )
        self.context.metrics.add_time(PREDICTION_METRIC, (time.monotonic() - started) * 1000)
        return results

    def _failure(self, exc: Exception) -> WeirError:
        """A handler's exception as TorchServe answers it."""
        name = self.config.name
        code, message = getattr(exc, "error_code", None), getattr(exc, "message", None)
        if isinstance(code, int) and message is not None:  # ts.utils.util.PredictionException
            logger.warning("model %s: prediction error %d: %s", name, code, message)
            return ERRORS_BY_CODE.get(code, ServerError)(str(message))
        if isinstance(exc, MemoryError) or "CUDA" in str(exc):
            logger.error("model %s: out of resources", name, exc_info=exc)
            return ServerError(f"model '{name}': Out of resources: {type(exc).__name__}: {exc}")
        logger.error("model %s: invoking the handler failed", name, exc_info=exc)
        return Unavailable(f"model '{name}': Prediction failed: {type(exc).__name__}: {exc}")

    def _answers(self, results: list[Any], states: list[RequestState]) -> dict[str, np.ndarray]:
        bodies: list[bytes] = []
        headers: list[bytes] = []
        for value, state in zip(results, states, strict=True):
            if state.get_response_header(STREAM_NEXT) == "true":  # it streamed: this ends it
                state.add_response_property(STREAM_NEXT, "false")
            body, as_json = self._serialize(value)
            bodies.append(body)
            headers.append(envelope.pack_headers(response_headers(state, as_json)))
        codes = [int(state.get_response_status_code()) for state in states]
        shape = (len(results), 1) if self.batches else (len(results),)
        return {
            envelope.RESPONSE: _objects(bodies).reshape(shape),
            envelope.STATUS: np.array(codes, dtype=np.int32).reshape(shape),
            envelope.HEADERS: _objects(headers).reshape(shape),
        }

    def _serialize(self, value: Any) -> tuple[bytes, bool]:
        try:
            return serialize(value)
        except (TypeError, ValueError) as exc:
            logger.warning("model %s: cannot serialize %r", self.config.name, value, exc_info=exc)
            raise Unavailable(
                f"model '{self.config.name}': Unsupported model output data type: "
                f"{type(value).__name__}"
            ) from exc


def _objects(items: list[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def _unpack(path: Path) -> Path:
    try:
        return archive.extract(path, archive.default_cache_dir())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot unpack the model archive: {exc}") from None
