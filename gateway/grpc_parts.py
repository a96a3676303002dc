"""Decoupled models over gRPC: every response of a request, as ``ModelStreamInfer`` sends it.

A decoupled model (``model_transaction_policy { decoupled: true }``) sends a request
responses before its last as it runs (``context.send_part``, :mod:`workers.parts`), and its
answer is the last one. As Triton, only ``ModelStreamInfer`` serves such a model: each
response is a ``ModelStreamInferResponse`` with the request's ``id``, written as it comes.
``ModelInfer`` and HTTP's infer refuse it as Triton does (UNSUPPORTED: gRPC UNIMPLEMENTED,
HTTP 501), since they carry one response per request.

With the request parameter ``triton_enable_empty_final_response`` true, every response
carries the parameter ``triton_final_response``: false, and true on the last one, so a
client knows when a request is done (Triton sends an empty response for that when the model
ends without one; Weir's last response always has the answer's outputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.codec import InferBody
from gateway.grpc_codec import render_infer_response
from gateway.parts import PartListener
from weir.repository import ModelEntry
from weir.wire import InferReply

FINAL = "triton_final_response"
ENABLE_FINAL = "triton_enable_empty_final_response"
UNARY = "ModelInfer RPC doesn't support models with decoupled transaction policy"


def part_listener(
    entry: ModelEntry, version: str, request_id: str, body: InferBody, send: Callable[[Any], None]
) -> PartListener:
    """Renders each part as a ``ModelInferResponse`` and hands it to ``send``."""

    def take(reply: InferReply) -> None:
        outputs = reply.outputs
        if body.outputs:  # the asked outputs the part has, in the request's order
            chosen = [(o.name, outputs[o.name]) for o in body.outputs if o.name in outputs]
        else:
            chosen = list(outputs.items())
        response = render_infer_response(entry.name, version, request_id, chosen)
        mark(body, response, last=False)
        send(response)

    return take


def mark(body: InferBody, response: Any, last: bool) -> None:
    """Flag the response final or not, when the request asked for the flag."""
    if body.parameters.get(ENABLE_FINAL) is True:
        response.parameters[FINAL].bool_param = last
