"""Streamed parts: TorchServe's own frames read back, sent to the right request, numbered,
and passed on once by the gateway however often a batch runs.

The frames are made by TorchServe's own ``create_predict_response`` (the ``ts`` package),
on Weir's context, as ``send_intermediate_predict_response`` makes them in a handler.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from gateway.parts import PartFilter
from weir.errors import ServerError
from weir.tensors import Tensor
from weir.torchserve import envelope
from weir.wire import InferReply, InferRequest
from workers.backends.torchserve_context import Context, RequestState
from workers.backends.torchserve_stream import PartSocket, read_frame
from workers.batch_wait import never, running, send_part


def create_predict_response(*args: Any) -> bytes:
    """TorchServe's own frame (``ts.protocol.otf_message_handler``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # ts leaves its version file open
        from ts.protocol.otf_message_handler import create_predict_response as create
    return bytes(create(*args))


def context_of(batch: int) -> Context:
    context = Context("m", "/nowhere", {}, batch, None, "test")
    context.begin_batch(
        [f"uuid-{i}" for i in range(batch)], [RequestState({}) for _ in range(batch)]
    )
    return context


def request(i: int) -> InferRequest:
    return InferRequest(f"r{i}", "m", "1", {}, "replies", 0)


def test_a_frame_of_torchserve_is_read_back_whole() -> None:
    context = context_of(2)
    context.set_response_content_type(0, "text/plain")
    context.set_response_status(201, "Created", idx=1)
    frame = create_predict_response(
        ["first", {"token": 1}], context.request_ids, "Intermediate", 200, context, True
    )
    first, second = read_frame(bytes(frame))
    assert (first.request_id, first.status, first.body) == ("uuid-0", 200, b"first")
    assert first.headers == {"content-type": "text/plain", "ts_stream_next": "true"}
    assert (second.request_id, second.status) == ("uuid-1", 201)
    assert second.body == b'{\n  "token": 1\n}'  # TorchServe's json.dumps(indent=2)
    with pytest.raises(ValueError, match="ends inside"):
        read_frame(bytes(frame)[:-2])


def test_each_part_goes_to_its_request_numbered_in_its_run() -> None:
    sent: list[tuple[str, int, dict[str, np.ndarray]]] = []
    context = context_of(2)
    socket = PartSocket("m", context, batches=True)
    members = [request(0), request(1)]
    with running(members, never, lambda r, n, outputs: sent.append((r.id, n, outputs))):
        for word in ("a", "b"):
            socket.sendall(
                create_predict_response([word, word * 2], context.request_ids, "", 200, context)
            )
    assert [(r, n) for r, n, _ in sent] == [("r0", 0), ("r1", 0), ("r0", 1), ("r1", 1)]
    outputs = sent[3][2]
    assert outputs[envelope.RESPONSE].shape == (1, 1)
    assert outputs[envelope.RESPONSE][0, 0] == b"bb"
    assert outputs[envelope.STATUS].tolist() == [[200]]
    # Outside a batch nothing can take a part; a broken frame is the handler's failure.
    assert not send_part(0, outputs)
    with pytest.raises(ServerError, match="unreadable"):
        socket.sendall(b"\x00\x00")


def test_rows_map_to_the_request_that_holds_them() -> None:
    taken: list[str] = []
    members = [request(0), request(1)]
    with running(members, never, lambda r, n, o: taken.append(r.id), rows=[2, 1]):
        for row in (0, 1, 2):
            send_part(row, {})
        with pytest.raises(IndexError):
            send_part(3, {})
    assert taken == ["r0", "r0", "r1"]


def test_the_gateway_passes_each_part_on_once_in_order() -> None:
    passed: list[bytes] = []
    parts = PartFilter(lambda reply: passed.append(reply.outputs["o"].data))

    def part(number: int, data: bytes) -> InferReply:
        reply = InferReply("r0", "m", "1", {"o": Tensor("BYTES", (1,), data)})
        reply.part = number
        return reply

    for number, data in [(0, b"a"), (1, b"b"), (0, b"a"), (1, b"b"), (2, b"c"), (2, b"x")]:
        parts.take(part(number, data))  # a batch delivered again sends its parts again
    assert passed == [b"a", b"b", b"c"]
