"""The Redis connection every service uses: one URL, a bounded pool, retries with backoff.

The URL may carry a password or an ACL user and may use TLS (``rediss://``); redis-py reads
all of that from the URL. The pool is a blocking one: under a burst, a command waits for a
free connection instead of failing, and Redis never sees more than ``max_connections``.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from weir import retry

DEFAULT_MAX_CONNECTIONS = 64
POOL_WAIT_S = 10.0


def connect(url: str, *, retries: int = 5, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> Redis:
    """A client for ``url`` that retries connection failures with exponential backoff."""
    # weir.retry's backoff: a reconnecting service's attempts stay about a second apart.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        decode_responses=False,
        retry=Retry(retry.backoff(), retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=30,
    )
    return Redis.from_pool(pool)
