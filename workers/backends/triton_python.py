"""Triton Python models: a ``model.py`` defining ``TritonPythonModel``, run as Triton runs it.

A model of the ``python`` backend whose ``model.py`` defines ``TritonPythonModel`` is a
Triton Python model (any other is Weir's handler shape, :mod:`workers.backends.python_backend`).
It imports ``triton_python_backend_utils`` (:mod:`workers.backends.pb_utils`, put in
``sys.modules`` under that name). For each instance:

- ``initialize(args)`` gets Triton's ``args``: ``model_config`` (the config as Triton's JSON
  text), ``model_instance_kind`` (``CPU``/``GPU``), ``model_instance_name``,
  ``model_instance_device_id``, ``model_repository`` (the model's directory),
  ``model_version`` and ``model_name``.
- ``execute(requests)`` gets one :class:`pb_utils.InferenceRequest` per request of the batch
  Weir formed, each with its own rows of every input (the batch dimension kept, as Triton's
  dynamic batcher hands them), its requested outputs and ``is_cancelled()``; it returns one
  :class:`pb_utils.InferenceResponse` per request, in order. Weir puts the answers back
  into one batch: every response must have the outputs its request asks for (all, when it
  names none), each with the request's rows, in the config's datatype (cast when the cast
  keeps the kind, as for Weir's handlers).
- A response with an error fails the call's requests with its message and the code's
  meaning (``INVALID_ARG`` 400, ``NOT_FOUND`` 404, ``UNAVAILABLE`` 503, ``UNSUPPORTED`` 501,
  anything else 500); Weir runs the batch again in halves, as for any failure
  (:mod:`workers.execution`), so the other requests are answered. ``TritonModelException``
  or any other exception from ``execute`` fails the call the same way.
- A decoupled model (``model_transaction_policy { decoupled: true }``) answers through each
  request's ``get_response_sender()``, from ``execute`` or from threads of its own after
  ``execute`` returns (:mod:`workers.backends.triton_senders`); the instance is held until
  every request of the batch has had its final flag.
- ``finalize()`` runs when the instance's lane stops (an unload, the worker's end).
- ``execute`` may call other models (Triton's BLS: ``pb_utils.InferenceRequest(...).exec()``,
  :mod:`workers.bls`), and may be ``async def`` to overlap such calls with ``async_exec()``.
- ``auto_complete_config`` has filled the config before any service read it
  (:mod:`weir.python_autocomplete`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from weir.config import ModelConfig
from weir.config_json import config_json
from weir.errors import ConfigError, ServerError, WeirError
from workers import batch_wait
from workers.backends import pb_utils
from workers.backends.base import ModelBackend
from workers.backends.triton_senders import ResponseSender, error_of, finish

logger = logging.getLogger(__name__)

MODULE_NAME = "triton_python_backend_utils"  # what Triton Python models import


class TritonPythonBackend(ModelBackend):
    """One instance of a Triton Python model."""

    # execute may call other models (BLS) through the worker's event loop, or be async.
    waits_on_the_loop = True

    def __init__(
        self, config: ModelConfig, version_dir: Path, module: ModuleType, device: int | None
    ) -> None:
        self.config = config
        self.device = device
        self.batches = config.max_batch_size > 0
        path = version_dir / "model.py"
        self.model = module.TritonPythonModel()
        args = {
            "model_config": json.dumps(config_json(config)),
            "model_instance_kind": "CPU" if device is None else "GPU",
            "model_instance_name": f"{config.name}_0",
            "model_instance_device_id": str(device or 0),
            "model_repository": str(version_dir.parent),
            "model_version": version_dir.name,
            "model_name": config.name,
        }
        initialize = getattr(self.model, "initialize", None)
        if initialize is not None:
            try:
                initialize(args)
            except Exception as exc:
                raise ConfigError(
                    f"{path}: TritonPythonModel.initialize failed: {type(exc).__name__}: {exc}"
                ) from exc

    def close(self) -> None:
        """``finalize()``, when the model has one: its lane is stopping."""
        finalize = getattr(self.model, "finalize", None)
        if finalize is not None:
            finalize()

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        wait = batch_wait.current()
        members = list(wait.requests) if wait is not None else []
        rows = list(wait.rows) if wait is not None and wait.rows else [1] * len(members)
        if not members:  # outside a batch (a warm-up sample): one request of every row
            members, rows = [], [next(iter(inputs.values())).shape[0] if self.batches else 1]
        requests = self._requests(inputs, members, rows)
        if self.config.decoupled:
            senders = [
                ResponseSender(self.config, wait, members[i] if members else None, rows[i])
                for i in range(len(requests))
            ]
            for request, sender in zip(requests, senders, strict=True):
                request.response_sender = sender
            self._call_execute(requests)
            return finish(self.config.name, senders)
        responses = self._execute(requests)
        return self._outputs(requests, responses, rows)

    def _requests(
        self, inputs: dict[str, np.ndarray], members: list[Any], rows: list[int]
    ) -> list[pb_utils.InferenceRequest]:
        bounds = np.cumsum(rows)[:-1]
        split = {name: np.split(a, bounds) if self.batches else [a] for name, a in inputs.items()}
        every = [spec.name for spec in self.config.output]
        requests = []
        for i in range(len(rows)):
            member = members[i] if members else None
            tensors = [pb_utils.Tensor(name, parts[i]) for name, parts in split.items()]
            wanted = (member.outputs if member is not None else None) or every
            request_id = member.id if member is not None else ""
            parameters = member.parameters if member is not None else {}
            sequence = member.sequence if member is not None else None
            correlation_id, flags = sequence or (0, 0)
            requests.append(
                pb_utils.InferenceRequest(
                    tensors,
                    wanted,
                    request_id,
                    parameters,
                    _cancel,
                    correlation_id=correlation_id,
                    flags=flags,
                )
            )
        return requests

    def _call_execute(self, requests: list[pb_utils.InferenceRequest]) -> Any:
        name = self.config.name
        try:
            result = self.model.execute(requests)
            if inspect.iscoroutine(result):  # ``async def execute``: its calls overlap
                result = asyncio.run(result)
            return result
        except WeirError:
            raise
        except Exception as exc:
            logger.exception("Triton Python model %s: execute failed", name)
            message = f"model '{name}' failed in execute: {type(exc).__name__}: {exc}"
            raise ServerError(message) from exc

    def _execute(self, requests: list[pb_utils.InferenceRequest]) -> list[Any]:
        name = self.config.name
        responses = self._call_execute(requests)
        if not isinstance(responses, list) or len(responses) != len(requests):
            count = len(responses) if isinstance(responses, list) else type(responses).__name__
            raise ServerError(
                f"model '{name}': execute returned {count} responses for {len(requests)} "
                "requests: one per request is required"
            )
        for response in responses:
            error = error_of(response)
            if error is not None:
                raise error
        return responses

    def _outputs(
        self, requests: list[pb_utils.InferenceRequest], responses: list[Any], rows: list[int]
    ) -> dict[str, np.ndarray]:
        from workers.backends.python_backend import output_array

        name = self.config.name
        wanted = dict.fromkeys(n for r in requests for n in r.requested_output_names())
        outputs = {}
        for output in wanted:
            spec = self.config.output_spec(output)
            if spec is None:
                raise ServerError(f"model '{name}' has no output {output}")
            arrays = []
            for response, count in zip(responses, rows, strict=True):
                tensor = pb_utils.get_output_tensor_by_name(response, output)
                if tensor is None:
                    raise ServerError(f"model '{name}' returned no output {output}")
                array = output_array(name, output, spec.datatype, tensor.as_numpy())
                if self.batches and (array.ndim == 0 or array.shape[0] != count):
                    raise ServerError(
                        f"model '{name}' returned {output} with shape {list(array.shape)} for a "
                        f"request of {count} rows: its first dimension is the request's rows"
                    )
                arrays.append(array)
            outputs[output] = np.concatenate(arrays) if self.batches else arrays[0]
        return outputs


def _cancel() -> bool:
    return batch_wait.is_cancelled()
