"""Large infer bodies are parsed in a few threads of their own, not on the event loop.

Parsing a body is CPU work, and while it runs on the event loop no other request is read,
answered or timed out. A thread hop costs tens of microseconds, so bodies up to
``parse_inline_bytes`` parse inline; larger ones in a pool of ``parse_threads`` threads,
where more wait their turn (many big bodies cannot spawn threads without bound).

The GIL is still shared. The Python steps of a parse (flattening nested lists, encoding
strings) give it back to the event loop every switch interval, and numpy lets go of it; but
orjson and protobuf hold it for a whole call, so what bounds those calls is what a body may
hold (:mod:`gateway.json_bounds`, and the counts checked before anything is built).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from weir.settings import GatewaySettings

T = TypeVar("T")


async def parse(settings: GatewaySettings, size_bytes: int, parse_now: Callable[[], T]) -> T:
    """``parse_now()``: inline for a body of up to ``parse_inline_bytes``, else in a thread.

    A call cancelled while its body is parsed returns at once; the thread finishes the
    parse and its result is dropped.
    """
    if size_bytes <= settings.parse_inline_bytes:
        return parse_now()
    executor = _executor(settings.parse_threads)
    return await asyncio.get_running_loop().run_in_executor(executor, parse_now)


@functools.cache
def _executor(threads: int) -> ThreadPoolExecutor:
    # Made when a first large body arrives and kept for the process: idle, it holds no
    # thread, and its threads are joined at exit.
    return ThreadPoolExecutor(threads, thread_name_prefix="weir-parse")
