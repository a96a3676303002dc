"""A Redis connection for the hot path: commands packed here, replies parsed by hiredis.

redis-py costs about 30 µs of Python per command and 85 µs per three-command transaction
beyond the round trip itself (its pool, retry wrapper, encoders, response callbacks and a
timeout per read), which on the mesh's hot path is more than Redis spends on the commands.
A :class:`Link` is one connection that sends a whole pipeline as one write and hands back
the raw replies (bytes, ints, lists; an error reply as a :class:`ResponseError` value, not
raised), resolved straight from the protocol's ``data_received``.

A link follows the URLs of :mod:`weir.redis_io.redis_target`: with Sentinel it asks the
Sentinels for the primary at each connect and checks the server's ``ROLE``; a ``READONLY``
reply (the server it holds was demoted) drops the connection so the next call finds the new
primary. With ``identify`` it records the server's ``run_id`` (:attr:`Link.server_id`) at
each connect: a different one means a different server, which may not hold what the last one
did.

Callers on one link share its connection, each pipeline's replies in order; a blocking
command (``XREAD BLOCK``) holds the connection until it returns, so a reader that blocks
has a link of its own. The URL is the same one redis-py reads: password, ACL user, database
and TLS (``rediss://`` with ``ssl_ca_certs``, ``ssl_cert_reqs``, ``ssl_certfile``,
``ssl_keyfile``, ``ssl_check_hostname``) or a unix socket. A lost connection fails what was
sent on it with :class:`ConnectionError` (a RedisError: Redis may or may not have run it)
and the next call connects again. Everything else in the services (startup, upkeep,
statistics) stays on redis-py.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import hiredis
from hiredis import pack_command
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from weir.redis_io import redis_target

Arg = bytes | str | int | float
Command = Sequence[Arg]
CONNECT_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 10.0
_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def pack(commands: Iterable[Command]) -> bytes:
    """The RESP encoding of ``commands``, one buffer for the whole pipeline.

    Each command is packed in C (hiredis's ``pack_command``: the same bytes as
    :func:`pack_each`, a quarter of its time; a worker's write-back of a batch is a few
    dozen arguments). A command it refuses (an ``IntEnum``, something that is no argument)
    sends the whole pipeline the general way, which packs it or says what is wrong.
    """
    commands = commands if isinstance(commands, list | tuple) else list(commands)
    try:
        return b"".join([pack_command(c if type(c) is tuple else tuple(c)) for c in commands])
    except TypeError:
        return pack_each(commands)


def pack_each(commands: Iterable[Command]) -> bytes:
    """:func:`pack`, argument by argument in Python."""
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            if isinstance(arg, bytes):
                data = arg
            elif isinstance(arg, str):
                data = arg.encode()
            elif isinstance(arg, int) and not isinstance(arg, bool):
                data = b"%d" % arg
            elif isinstance(arg, float):
                data = repr(arg).encode()
            else:
                raise TypeError(f"cannot send {type(arg).__name__} to Redis")
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


ONE_SERVER = "one server"  # HotLink.node_of of every slot when there is one server


class HotLink(Protocol):
    """What the services use of a hot-path link: :class:`Link`, or a cluster's."""

    # With ``identify``: the run_id of the one server reached (None on a cluster).
    server_id: bytes | None
    # Changes of the servers behind the link that it learned of without reconnecting (a
    # cluster's slot moving to another primary); always 0 for one server.
    epoch: int

    async def refresh(self) -> None:
        """Learn the servers behind the link again (a cluster's slot map); else nothing."""
        ...

    async def connect(self) -> None: ...

    async def call(self, *commands: Command, block_s: float = 0.0) -> list[Any]: ...

    async def transaction(self, *commands: Command) -> list[Any]: ...

    async def close(self) -> None: ...

    def slot_of(self, key: str) -> int:
        """The Redis Cluster slot of ``key``; 0 for every key on one server."""
        ...

    def node_of(self, slot: int) -> Hashable:
        """The server that holds ``slot`` now, for what is kept per server.

        :data:`ONE_SERVER` on one server; None while not known (a cluster before its map).
        """
        ...


@dataclass(slots=True)
class _Waiter:
    count: int
    future: asyncio.Future[list[Any]]
    replies: list[Any] = field(default_factory=list)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = hiredis.Reader(replyError=ResponseError)
        self.waiting: deque[_Waiter] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed(data)
        waiting = self.waiting
        demoted = False
        while (reply := self.parser.gets()) is not False:
            if not waiting:
                self._fail(RedisConnectionError("Redis sent a reply nobody asked for"))
                return
            if type(reply) is ResponseError and str(reply).startswith("READONLY"):
                demoted = True
            waiter = waiting[0]
            waiter.replies.append(reply)
            if len(waiter.replies) == waiter.count:
                waiting.popleft()
                if not waiter.future.done():
                    waiter.future.set_result(waiter.replies)
        if demoted:  # a replica now: the next call connects to the primary
            self._fail(RedisConnectionError("the Redis server is a read-only replica now"))

    def expire(self, future: asyncio.Future[list[Any]], timeout_s: float) -> None:
        # No reply in time: the connection may be half-open (Redis gone without a reset).
        # Replies still on their way would answer the wrong callers, so it is dropped.
        if not future.done():
            self._fail(RedisConnectionError(f"Redis did not answer within {timeout_s:g} s"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(error)
        if self.transport is not None:
            self.transport.close()


class Link:
    """One Redis connection for pipelines of raw commands; connects on first use."""

    def __init__(
        self,
        url: str,
        reply_timeout_s: float = REPLY_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        identify: bool = False,
    ) -> None:
        self.target = redis_target.parse(url)
        self.options: dict[str, Any] = dict(parse_url(self.target.url))
        self.reply_timeout_s = reply_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.identify = identify
        # The run_id of the server the current connection reached (with ``identify``).
        self.server_id: bytes | None = None
        self.epoch = 0  # one server: a change shows in server_id
        self._protocol: _Protocol | None = None
        self._connecting = asyncio.Lock()

    async def connect(self) -> None:
        """Connect now, unless connected; ConnectionError (a RedisError) when that fails."""
        protocol = self._protocol
        if protocol is None or protocol.closed:
            await self._connect()

    async def call(self, *commands: Command, block_s: float = 0.0) -> list[Any]:
        """Send ``commands`` as one pipeline; their replies, in order.

        An error reply is a ResponseError in the list. ConnectionError (a RedisError) when
        the connection fails, or no reply came within ``reply_timeout_s`` (plus ``block_s``,
        the time a blocking command may itself wait): commands already sent may or may not
        have run.
        """
        if not commands:
            return []
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connect()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        assert protocol.transport is not None
        protocol.waiting.append(_Waiter(len(commands), future))
        protocol.transport.write(pack(commands))
        timeout_s = self.reply_timeout_s + block_s
        timer = loop.call_later(timeout_s, protocol.expire, future, timeout_s)
        try:
            return await future
        finally:
            timer.cancel()

    async def transaction(self, *commands: Command) -> list[Any]:
        """Run ``commands`` in MULTI/EXEC; their results, or the first error raised.

        As redis-py's transactions: a command Redis refused to queue aborts the whole
        transaction; one that failed while running leaves the others done and is raised.
        """
        replies = await self.call(("MULTI",), *commands, ("EXEC",))
        raise_errors(replies[:-1])
        results = replies[-1]
        if not isinstance(results, list):
            raise ResponseError(f"transaction did not run: {results!r}")
        return raise_errors(results)

    def slot_of(self, key: str) -> int:
        return 0  # one server: every key on one "slot"

    def node_of(self, slot: int) -> Hashable:
        return ONE_SERVER

    async def refresh(self) -> None:
        return None  # one server: it reconnects by itself

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()

    async def _connect(self) -> _Protocol:
        async with self._connecting:
            if self._protocol is not None and not self._protocol.closed:
                return self._protocol
            try:
                protocol = await asyncio.wait_for(self._open(), self.connect_timeout_s)
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                raise RedisConnectionError(f"cannot connect to Redis: {exc!r}") from None
            self._protocol = protocol
            return protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        options = self.options
        connection_class = options.get("connection_class")
        if connection_class is UnixDomainSocketConnection:
            _, protocol = await loop.create_unix_connection(_Protocol, options["path"])
        else:
            context = _ssl_context(options) if connection_class is SSLConnection else None
            if self.target.is_sentinel:
                host, port = await _sentinel_primary(self.target, context)
            else:
                host, port = options.get("host", "localhost"), options.get("port", 6379)
            protocol = await _open_tcp(host, port, context)
        handshake = _auth(options.get("username"), options.get("password"))
        if options.get("db"):
            handshake.append(["SELECT", options["db"]])
        if self.target.is_sentinel:
            handshake.append(["ROLE"])
        if self.identify:
            handshake.append(["INFO", "server"])
        replies = await _exchange(protocol, handshake)
        for reply in replies:
            if isinstance(reply, ResponseError):
                _close(protocol)
                raise RedisConnectionError(f"Redis refused the connection: {reply}")
        if self.identify:
            self.server_id = _info_field(replies.pop(), b"run_id")
        if self.target.is_sentinel and replies[-1][0] != b"master":
            _close(protocol)
            raise RedisConnectionError(
                f"the server Sentinel named as primary of {self.target.service!r} is a replica"
            )
        return protocol


async def _open_tcp(host: str, port: int, context: ssl.SSLContext | None) -> _Protocol:
    _, protocol = await asyncio.get_running_loop().create_connection(
        _Protocol, host, port, ssl=context
    )
    sock = protocol.transport.get_extra_info("socket") if protocol.transport else None
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return protocol


def _auth(username: str | None, password: str | None) -> list[Command]:
    if password is None:
        return []
    return [["AUTH", username, password] if username else ["AUTH", password]]


async def _exchange(protocol: _Protocol, commands: list[Command]) -> list[Any]:
    """The replies to ``commands`` on a connection no one else uses yet."""
    if not commands:
        return []
    future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
    protocol.waiting.append(_Waiter(len(commands), future))
    assert protocol.transport is not None
    protocol.transport.write(pack(commands))
    return await future


def _close(protocol: _Protocol) -> None:
    if protocol.transport is not None:
        protocol.transport.close()


async def _sentinel_primary(
    target: redis_target.Target, context: ssl.SSLContext | None
) -> tuple[str, int]:
    """The primary's address, from the first Sentinel that knows it."""
    problems: list[str] = []
    auth = _auth(target.sentinel_auth.get("sentinel_username"),
                 target.sentinel_auth.get("sentinel_password"))  # fmt: skip
    for host, port in target.sentinels:
        try:
            protocol = await _open_tcp(host, port, context)
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"{host}:{port}: {exc}")
            continue
        try:
            replies = await _exchange(
                protocol, [*auth, ["SENTINEL", "GET-MASTER-ADDR-BY-NAME", target.service]]
            )
        except RedisConnectionError as exc:
            problems.append(f"{host}:{port}: {exc}")
            continue
        finally:
            _close(protocol)
        answer = replies[-1]
        if isinstance(answer, list) and len(answer) == 2:
            return answer[0].decode(), int(answer[1])
        problems.append(f"{host}:{port}: {answer or 'no such service'}")
    raise RedisConnectionError(
        f"no Sentinel named a primary for {target.service!r}: " + "; ".join(problems)
    )


def _info_field(info: object, name: bytes) -> bytes | None:
    """One ``name:value`` line of an INFO reply."""
    if not isinstance(info, bytes):
        return None
    for line in info.splitlines():
        key, _, value = line.partition(b":")
        if key == name:
            return value.strip()
    return None


def _ssl_context(options: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    reqs = options.get("ssl_cert_reqs", "required")
    verify = _CERT_REQS[reqs] if isinstance(reqs, str) else reqs
    # As redis-py: the host name is checked unless the URL says otherwise or nothing is.
    context.check_hostname = verify != ssl.CERT_NONE and options.get("ssl_check_hostname", True)
    context.verify_mode = verify
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context


def raise_errors(replies: list[Any]) -> list[Any]:
    """``replies``, or the first error among them raised."""
    for reply in replies:
        if isinstance(reply, ResponseError):
            raise reply
    return replies
