"""The Redis connection every service uses: one URL, retries with exponential backoff.

The URL may carry a password or an ACL user and may use TLS (``rediss://``); redis-py reads
all of that from the URL.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def connect(url: str, *, retries: int = 5, max_connections: int | None = None) -> Redis:
    """A client for ``url`` that retries connection failures with exponential backoff."""
    return Redis.from_url(
        url,
        decode_responses=False,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=30,
        max_connections=max_connections,
    )
