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


def last_response(
    entry: ModelEntry, version: str, request_id: str, body: InferBody, reply: InferReply
) -> Any:
    """The response that ends a decoupled model's request; None when there is none to send.

    A request ended with no last response (a Triton Python model's final flag alone) has no
    outputs: Triton's empty final response when the client asked for one, else nothing.
    """
    if not reply.outputs and body.parameters.get(ENABLE_FINAL) is not True:
        return None
    response = render_infer_response(entry.name, version, request_id, _chosen(body, reply))
    mark(body, response, last=True)
    return response


def part_listener(
    entry: ModelEntry, version: str, request_id: str, body: InferBody, send: Callable[[Any], None]
) -> PartListener:
    """Renders each part as a ``ModelInferResponse`` and hands it to ``send``."""

    def take(reply: InferReply) -> None:
        response = render_infer_response(entry.name, version, request_id, _chosen(body, reply))
        mark(body, response, last=False)
        send(response)

    return take


def _chosen(body: InferBody, reply: InferReply) -> list[tuple[str, Any]]:
    """The asked outputs the reply has, in the request's order (all, when it asked none)."""
    outputs = reply.outputs
    if body.outputs:
        return [(o.name, outputs[o.name]) for o in body.outputs if o.name in outputs]
    return list(outputs.items())


def mark(body: InferBody, response: Any, last: bool) -> None:
    """Flag the response final or not, when the request asked for the flag."""
    if body.parameters.get(ENABLE_FINAL) is True:
        response.parameters[FINAL].bool_param = last
