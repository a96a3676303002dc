"""HTTP/1.1 as uvicorn's httptools protocol serves it, with the limits a hostile client meets.

uvicorn bounds neither the request head nor the time a client takes to send it, so one
client could stall the event loop with a huge head or hold descriptors with connections that
never finish a request. This protocol adds, before anything reaches the app (or its tokens):

- a head (request line and headers) over ``max_header_bytes`` or with more than
  ``max_headers`` headers: 431, and the connection closes; the parser never sees more than
  the limit;
- a head not complete within ``header_timeout_s`` of the connection (or, on a kept-alive
  connection, of its first byte): 408, closed;
- a body that sends nothing for ``body_idle_timeout_s``: the connection closes (the app sees a
  disconnect);
- a kept-alive connection idle for uvicorn's ``timeout_keep_alive`` (the gateway's
  ``keep_alive_timeout_s``) between requests: closed, as uvicorn closes it;
- a connection past ``max_connections`` open ones: 503, closed at once.

Each request's scope also carries the connection's :class:`~gateway.disconnect.Disconnect`,
so an inference whose client left is cancelled at once rather than computed for nobody.

A plain ``POST .../infer`` is answered here, without ASGI (:mod:`gateway.direct_infer`), and
so is a plain TorchServe prediction (:mod:`gateway.torchserve.direct_predictions`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.coalesced_writes import CoalescedWrites
from gateway.direct_infer import InferExchange, exchange_for
from gateway.disconnect import SCOPE_KEY, Disconnect
from gateway.state import STATE_KEY, GatewayState
from gateway.torchserve.direct_predictions import prediction_exchange
from gateway.torchserve.streaming import ChunkedAnswer

_TAKEN = (b"POST", b"PUT")  # KServe's infer (POST) and TorchServe's predictions (POST, PUT)
REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The limits of one gateway's HTTP connections (from its settings)."""

    max_header_bytes: int
    max_headers: int
    header_timeout_s: float
    body_idle_timeout_s: float
    max_connections: int


class _TooManyHeaders(Exception):
    pass


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`HttpLimits`; built by :func:`protocol_class`."""

    limits: HttpLimits
    management_port: int  # 0: none; its requests all go to the ASGI app

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        # The one deadline the connection has now (head, or body idle): read by _sweep.
        self._deadline_s = 0.0
        self._on_deadline: Callable[[], None] | None = None
        self._disconnect = Disconnect()
        self._state: GatewayState | None = None  # set when inference can be answered here
        self._idle = False  # the deadline armed is the keep-alive one, between requests

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Every write of the connection, the app's responses and the protocol's own, goes
        # through it: a response's head and body leave in one send.
        self.transport = CoalescedWrites(transport, self.loop)  # type: ignore[assignment]
        if self.server is None or self.server[1] != self.management_port:
            self._state = self.app_state.get(STATE_KEY)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "the gateway holds its most connections; retry later")
            return
        self._arm(self.limits.header_timeout_s, self._head_late)  # a silent client too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if isinstance(self.cycle, InferExchange):
            self.cycle.disconnected = True
            self.cycle = None  # type: ignore[assignment]  # uvicorn's own code reads a cycle
        super().connection_lost(exc)
        self._disconnect.fire()

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        # As uvicorn's own data_received does first: a request arriving on a kept-alive
        # connection stops the idle timer, which would otherwise close the connection under
        # a request that takes longer than the keep-alive timeout to answer.
        self._unset_keepalive_if_required()
        if not self._in_head:
            self._arm(self.limits.body_idle_timeout_s, self._body_idle)
            self._feed(data)
            return
        if self._on_deadline is None or self._idle:  # a request's first byte after the last
            self._idle = False
            self._arm(self.limits.header_timeout_s, self._head_late)
        room = self.limits.max_header_bytes - self._head_bytes
        head, rest = data[:room], data[room:]
        self._head_bytes += len(head)
        self._feed(head)
        if rest and self._in_head:
            self._refuse(431, f"the request head exceeds {self.limits.max_header_bytes} bytes")
        elif rest:
            self.data_received(rest)  # a body, or the next request's head

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except _TooManyHeaders:
            self._refuse(431, f"the request has more than {self.limits.max_headers} headers")
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _TooManyHeaders):
                self._refuse(431, f"the request has more than {self.limits.max_headers} headers")
            else:
                self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserError:
            self.send_400_response("Invalid HTTP request received.")
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            raise _TooManyHeaders
        super().on_header(name, value)

    def on_message_begin(self) -> None:
        # uvicorn builds the request's ASGI scope here; it is built in on_headers_complete
        # instead, and only for a request the ASGI app serves: those answered here need none.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._arm(self.limits.body_idle_timeout_s, self._body_idle)
        if self._state is not None and self._take_infer(self._state):
            return
        url, headers, expect_100_continue = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()  # the scope, as uvicorn makes it
        self.url, self.expect_100_continue = url, expect_100_continue
        self.headers = self.scope["headers"] = headers
        self.scope[SCOPE_KEY] = self._disconnect  # type: ignore[literal-required]
        super().on_headers_complete()

    def _take_infer(self, state: GatewayState) -> bool:
        """Answer the request here when it is a plain infer request (see the module)."""
        parser = self.parser
        method = parser.get_method()
        if method not in _TAKEN or self.expect_100_continue or parser.should_upgrade():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # pipelined behind a request not yet answered: uvicorn queues it
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        exchange = exchange_for(method, self.url, self.headers, keep_alive)
        if exchange is None:
            exchange = prediction_exchange(method, self.url, self.headers, keep_alive)
            if exchange is None:
                return False
            chunked = parser.get_http_version() != "1.0"
            exchange.stream = ChunkedAnswer(self.transport, self.server_state, keep_alive, chunked)
        self.cycle = exchange  # type: ignore[assignment]
        if not exchange.start(exchange.body_limit(state)):
            self._answer(exchange, state)  # refused by its head: answered before its body
        return True

    def on_body(self, body: bytes) -> None:
        exchange = self.cycle
        if not isinstance(exchange, InferExchange):
            super().on_body(body)
        elif self._state is not None and not exchange.feed(body, self._state):
            self._answer(exchange, self._state)  # refused: answered before the rest arrives

    def on_message_complete(self) -> None:
        self._cancel_timer()
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
        exchange = self.cycle
        if not isinstance(exchange, InferExchange):
            super().on_message_complete()
        elif self._state is not None:
            self._answer(exchange, self._state)

    def on_response_complete(self) -> None:
        # As uvicorn's, but the keep-alive timeout is the connection's deadline, which the
        # sweep checks, not a timer made and cancelled per request (3 µs of each).
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._in_head and self._head_bytes == 0:  # nothing of the next request yet
            self._arm(self.timeout_keep_alive, self._keep_alive_over)
            self._idle = True

    def _keep_alive_over(self) -> None:
        if self._idle and not self.transport.is_closing():
            self.transport.close()

    def _answer(self, exchange: InferExchange, state: GatewayState) -> None:
        if exchange.answering:
            return
        exchange.answering = True
        task = self.loop.create_task(self._respond(exchange, state))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)  # the server waits for them when it shuts down

    async def _respond(self, exchange: InferExchange, state: GatewayState) -> None:
        status, lines = await exchange.run(state, self._disconnect)
        if not lines:  # streamed: written and ended as its parts came
            if state.metrics.counts_responses:
                state.metrics.responded(status)
            exchange.response_complete = True
            self.on_response_complete()
            return
        if self.flow.write_paused and not exchange.disconnected:
            await self.flow.drain()
        if exchange.disconnected or self.transport.is_closing():
            return
        if state.metrics.counts_responses:
            state.metrics.responded(status)
        head = [STATUS_LINE[status]]
        head.extend(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers)
        head.extend(lines[:-1])
        if not exchange.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        head.append(lines[-1])
        self.transport.write(b"".join(head))
        exchange.response_complete = True
        if not exchange.keep_alive:
            self.transport.close()
        self.on_response_complete()

    def _arm(self, delay_s: float, handler: Callable[[], None]) -> None:
        # A deadline, not a timer: a request would otherwise make and cancel two timers.
        self._deadline_s = self.loop.time() + delay_s
        self._on_deadline = handler
        _sweeping(self.loop, self.connections, self.limits)

    def _cancel_timer(self) -> None:
        self._on_deadline = None

    def _head_late(self) -> None:
        if self._in_head:
            self._refuse(408, f"the request head took over {self.limits.header_timeout_s:g} s")

    def _body_idle(self) -> None:
        if not self._in_head and not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` (KServe's error shape) and close the connection."""
        if self.transport.is_closing():
            return
        self._cancel_timer()
        body = b'{"error":"' + message.encode() + b'"}'
        head = [
            b"HTTP/1.1 %d %s\r\n" % (status, REASONS[status]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
        ]
        if status == 503:
            head.append(b"retry-after: 1\r\n")
        state: GatewayState | None = self.app_state.get(STATE_KEY)
        if state is not None and state.metrics.counts_responses:
            state.metrics.responded(status)
        self.transport.write(b"".join([*head, b"\r\n", body]))
        self.transport.close()


# The sweep of each server's connections (by loop and connection set), while it has any.
_SWEEPS: dict[tuple[asyncio.AbstractEventLoop, int], asyncio.TimerHandle] = {}


def _sweeping(loop: asyncio.AbstractEventLoop, connections: set[Any], limits: HttpLimits) -> None:
    """Make sure ``loop`` sweeps ``connections`` for deadlines passed.

    One timer per server checks every connection a few times per shortest timeout, so a
    deadline fires at most that much late; it stops once no connection is left.
    """
    if (loop, id(connections)) not in _SWEEPS:
        tick_s = min(max(min(limits.header_timeout_s, limits.body_idle_timeout_s) / 8, 0.02), 0.5)
        _SWEEPS[(loop, id(connections))] = loop.call_later(
            tick_s, _sweep, loop, connections, tick_s
        )


def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any], tick_s: float) -> None:
    now_s = loop.time()
    for connection in list(connections):
        handler = getattr(connection, "_on_deadline", None)  # a websocket has none
        if handler is not None and now_s >= connection._deadline_s:
            connection._on_deadline = None
            handler()
    key = (loop, id(connections))
    if connections:
        _SWEEPS[key] = loop.call_later(tick_s, _sweep, loop, connections, tick_s)
    else:
        del _SWEEPS[key]


def protocol_class(limits: HttpLimits, management_port: int = 0) -> type[LimitedHttpProtocol]:
    """A protocol class for uvicorn's ``http=`` option, holding ``limits``.

    Requests on ``management_port`` (TorchServe's, when served) all go to the ASGI app.
    """
    attributes = {"limits": limits, "management_port": management_port}
    return type("GatewayHttpProtocol", (LimitedHttpProtocol,), attributes)
