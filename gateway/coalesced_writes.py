"""A transport whose writes within one turn of the event loop leave in a single send.

uvicorn writes a response's head and its body with two ``transport.write`` calls, and
asyncio sends each at once when the socket has room: two ``send`` system calls and two TCP
segments for every small response, most of the gateway's cost of answering after the work
itself. :class:`CoalescedWrites` stands between the HTTP protocol and its transport and
holds small writes until the end of the loop's turn, then sends them joined. Order is kept
(every write of the connection goes through it, a large one sends what is held first) and
closing sends what is held before the transport closes.
"""

from __future__ import annotations

import asyncio
from typing import Any

# A write this large goes out at once (after what is held): joining it would copy it.
DIRECT_BYTES = 64 * 1024


class CoalescedWrites:
    """Wraps an asyncio transport; everything but ``write`` and ``close`` passes through."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if len(data) >= DIRECT_BYTES:
            self.flush()
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        """Send what is held, in one write."""
        if not self._held:
            return
        held, self._held = self._held, []
        if not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
