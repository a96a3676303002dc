"""The floor of a Python gateway on Weir's mesh: its protocol with nothing else around it.

    python -m bench.floor_gateway --redis-url URL --port PORT

It answers ``POST /v2/models/<m>[/versions/<v>]/infer`` bodies of JSON float inputs by the
mesh's own protocol, as the real gateway does, sharing its code for each step: the body
parsed by orjson, each input's flat data made a float tensor in one pass in C
(``gateway.json_data.flat_floats``), the request encoded (``weir.wire``), admitted through
``gateway.admission.Admission`` (coalesced, the queue-limit script), its reply read by XREAD
on the gateway's own reply stream and resolved to the waiting request, the outputs rendered
by orjson. It leaves out everything else the gateway does per request: validation against
the model's config, error shapes, metrics, deadlines, cancellation, resubmission after a
Redis failover, limits, authentication, compression, binary data, shared memory. So it is
no server to use: it measures (``bench.floor``) what the design's hot path costs in Python
on a machine, the least any gateway written in Python could spend per request there.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import time
import uuid
from typing import Any

import httptools
import numpy as np
import orjson
import uvloop

from gateway.admission import Admission
from gateway.json_data import flat_floats
from weir import datatypes, names, wire
from weir.redis_io.link import HotLink
from weir.redis_io.links import open_link
from weir.stages import ENSURE_SCRIPT
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest

INFER = re.compile(rb"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
READY = b"/v2/health/ready"
QUEUE_LIMIT = 1024
TIMEOUT_MS = 60_000


class Floor:
    """The gateway's state: its reply stream, the requests waiting, the admission."""

    def __init__(self, redis_url: str) -> None:
        self.gateway_id = uuid.uuid4().hex[:16]
        self.reply_stream = names.reply_stream(self.gateway_id)
        self.waiting: dict[str, asyncio.Future[InferReply]] = {}
        self.ids = itertools.count()
        self.admission = Admission(open_link(redis_url))
        self.reply_link: HotLink = open_link(redis_url)
        self.ready = False

    async def infer(self, model: str, version: str, body: bytes) -> tuple[int, bytes]:
        inputs = {}
        for raw in orjson.loads(body)["inputs"]:
            name, datatype, shape = raw["name"], raw["datatype"], tuple(raw["shape"])
            data = flat_floats(name, datatype, raw["data"])
            if data is None:
                return 400, b'{"error":"the floor gateway takes flat float data only"}'
            inputs[name] = Tensor(datatype, shape, data)
        now_ns = time.time_ns()
        request = InferRequest(
            id=f"{self.gateway_id}-{next(self.ids)}", model=model, version=version,
            inputs=inputs, reply_to=self.reply_stream,
            deadline_ms=now_ns // 1_000_000 + TIMEOUT_MS, ts={Stamp.GATEWAY_IN: now_ns},
        )  # fmt: skip
        batch = next(iter(inputs.values())).shape[0] if inputs else 1
        future = asyncio.get_running_loop().create_future()
        self.waiting[request.id] = future
        try:
            fields = wire.request_fields(request, batch)
            await self.admission.enqueue(model, version, fields, QUEUE_LIMIT)
            reply = await future
        finally:
            del self.waiting[request.id]
        if reply.error is not None:
            return 500, orjson.dumps({"error": reply.error[1]})
        outputs: list[dict[str, Any]] = [
            {"name": name, "datatype": tensor.datatype, "shape": list(tensor.shape),
             "data": np.frombuffer(tensor.data, datatypes.numpy_dtype(tensor.datatype))}
            for name, tensor in reply.outputs.items()
        ]  # fmt: skip
        response = {"model_name": model, "model_version": version, "outputs": outputs}
        return 200, orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)

    async def read_replies(self) -> None:
        await self.reply_link.call(("EVAL", ENSURE_SCRIPT, 1, self.reply_stream))
        self.ready = True
        last_id = b"0-0"
        while True:
            _, result = await self.reply_link.call(
                ("XTRIM", self.reply_stream, "MINID", last_id),
                ("XREAD", "COUNT", 256, "BLOCK", 1000, "STREAMS", self.reply_stream, last_id),
                block_s=1.0,
            )
            for _, entries in result or []:
                for entry_id, fields in entries:
                    for payload in wire.decode_batch(wire.flat_field(fields, wire.PAYLOAD)):
                        reply = InferReply.decode(payload)
                        future = self.waiting.get(reply.id)
                        if future is not None and not future.done():
                            future.set_result(reply)
                    last_id = entry_id
            await asyncio.sleep(0)  # the requests just answered write first


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: each request answered by a task of its own."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write(400, b'{"error":"invalid HTTP request"}')
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(self.url, b"".join(self.body)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, url: bytes, body: bytes) -> None:
        match = INFER.fullmatch(url)
        if url == READY:
            status, content = (200, b"{}") if self.floor.ready else (503, b"{}")
        elif match is None:
            status, content = 404, b'{"error":"not found"}'
        else:
            model, version = match.group(1).decode(), (match.group(2) or b"1").decode()
            status, content = await self.floor.infer(model, version, body)
        self._write(status, content)

    def _write(self, status: int, content: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        reason = b"OK" if status == 200 else b"Error"
        self.transport.write(head % (status, reason, len(content)) + content)


async def serve(redis_url: str, port: int) -> None:
    floor = Floor(redis_url)
    loop = asyncio.get_running_loop()
    reader = loop.create_task(floor.read_replies())
    server = await loop.create_server(lambda: Connection(floor), "127.0.0.1", port)
    async with server:
        await reader


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the floor of a Python gateway on the mesh")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.redis_url, args.port))


if __name__ == "__main__":
    main()
