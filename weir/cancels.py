"""Requests nobody waits for any more: the notices gateways write, the watch the others keep.

A client that disconnects (HTTP) or cancels its call (gRPC) leaves its request in the mesh.
The gateway that accepted it appends the request's id to the model's cancel stream
(:func:`weir.names.cancel_stream`); every batcher and worker watches the cancel streams of
what it serves with a plain ``XREAD`` (each reader sees every notice, which a consumer
group would not give) and drops what it holds: the batcher before it batches the request, a
worker before it runs it. A notice matters only until the requests' deadline, after which
the deadline drops them anyway, so a watch forgets ids then and the streams are capped.

A pipeline's notice names the pipeline request; its steps' requests (``<id>/<step>``)
count as cancelled with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError, ResponseError

from weir.redis_io.fanin import FanIn
from weir.redis_io.link import Arg, Command
from weir.redis_io.links import open_link
from weir.redis_io.retry import RetryWait

logger = logging.getLogger(__name__)

IDS = b"ids"  # the cancelled request ids, space-separated
UNTIL = b"until"  # unix ms after which the notice no longer matters (the latest deadline)
NOTICE_MAXLEN = 10_000  # notices kept per stream (each names one or many requests)
READ_COUNT = 1000


def notice(stream: str, ids: list[str], until_ms: int) -> Command:
    """The command that appends one notice for ``ids`` to ``stream``."""
    fields: list[Arg] = [IDS, " ".join(ids), UNTIL, until_ms]
    return ("XADD", stream, "MAXLEN", "~", NOTICE_MAXLEN, "*", *fields)


class CancelWatch:
    """The cancelled ids of the streams it watches, read as notices arrive.

    ``on_notice(stream, ids)`` is called for each notice read (the batcher drops what it
    queued at once); :meth:`is_canceled` answers for any request id, cheaply when nothing
    was cancelled.
    """

    def __init__(
        self,
        url: str,
        reply_timeout_s: float,
        block_ms: int = 1000,
        on_notice: Callable[[str, list[str]], None] | None = None,
    ) -> None:
        self.link = open_link(url, reply_timeout_s)
        self.fanin = FanIn(self.link)
        self.block_ms = block_ms
        self.on_notice = on_notice
        self.canceled: dict[str, int] = {}  # request id -> until (unix ms)
        self._streams: list[str] = []
        self._last: dict[str, bytes] = {}
        self._changed = asyncio.Event()
        self._next_forget_ms = 0

    def watch(self, streams: list[str]) -> None:
        """Watch these streams from now on (from their start: notices already there count)."""
        self._streams = list(dict.fromkeys(streams))
        self._changed.set()

    def is_canceled(self, request_id: str) -> bool:
        canceled = self.canceled
        if not canceled:
            return False
        if request_id in canceled:
            return True
        route, step, _ = request_id.partition("/")
        return bool(step) and route in canceled

    async def run(self, should_exit: asyncio.Event) -> None:
        """Read notices until told to exit (a read ends within ``block_ms``)."""
        retry = RetryWait()
        while not should_exit.is_set():
            streams = self._streams
            if not streams:
                self._changed.clear()
                await _either(self._changed, should_exit)
                continue
            try:
                await self._read(streams)
            except RedisError as exc:
                logger.warning("reading cancel notices failed, retrying: %s", exc)
                await retry.failed()
                continue
            retry.succeeded()

    async def _read(self, streams: list[str]) -> None:
        head: list[Arg] = ["XREAD", "COUNT", READ_COUNT, "BLOCK", self.block_ms, "STREAMS"]

        def build(some: list[str]) -> Command:
            return [*head, *some, *(self._last.get(stream, b"0-0") for stream in some)]

        for reply in await self.fanin.read(build, streams, self.block_ms / 1000):
            if isinstance(reply, ResponseError):
                raise reply
            now_ms = int(time.time() * 1000)
            for raw_stream, entries in reply or []:
                stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
                for entry_id, flat in entries:
                    self._last[stream] = entry_id
                    self._take(stream, dict(zip(flat[::2], flat[1::2], strict=True)), now_ms)
        self._forget(int(time.time() * 1000))

    def _take(self, stream: str, fields: dict[bytes, bytes], now_ms: int) -> None:
        until_ms = int(fields.get(UNTIL, b"0"))
        if until_ms <= now_ms:
            return  # every request it names is past its deadline already
        ids = fields.get(IDS, b"").decode().split()
        for request_id in ids:
            self.canceled[request_id] = until_ms
        if self.on_notice is not None and ids:
            self.on_notice(stream, ids)

    def _forget(self, now_ms: int) -> None:
        if now_ms < self._next_forget_ms:
            return
        self._next_forget_ms = now_ms + 1000
        stale = [rid for rid, until_ms in self.canceled.items() if until_ms <= now_ms]
        for request_id in stale:
            del self.canceled[request_id]

    async def close(self) -> None:
        await self.link.close()


async def _either(first: asyncio.Event, second: asyncio.Event) -> None:
    waiters = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
