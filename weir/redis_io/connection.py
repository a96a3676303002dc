"""The Redis connection every service uses: one URL, a bounded pool, retries with backoff.

The URL may carry a password or an ACL user and may use TLS (``rediss://``); redis-py reads
all of that from the URL. It may also name a primary that Redis Sentinel watches
(``redis+sentinel://``, see :mod:`weir.redis_io.redis_target`): the pool then asks the Sentinels for
the primary at each new connection, so after a failover the retries reach the new one. For
one server the pool is a blocking one: under a burst, a command waits for a free connection
instead of failing, and Redis never sees more than ``max_connections``.
"""

from __future__ import annotations

from typing import Any, cast

import redis
import redis.cluster
import redis.sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from weir.redis_io import redis_target, retry

DEFAULT_MAX_CONNECTIONS = 64
POOL_WAIT_S = 10.0

# redis-py types these constructors in some releases and not in others (its Sentinels gained
# types in 8.2); taken as Any, one source checks clean against every release we accept.
_Sentinel: Any = Sentinel
_SyncSentinel: Any = redis.sentinel.Sentinel
_SyncClusterNode: Any = redis.cluster.ClusterNode


def connect(url: str, *, retries: int = 5, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> Redis:
    """A client for ``url`` that retries connection failures with exponential backoff."""
    # weir.redis_io.retry's backoff: a reconnecting service's attempts stay about a second apart.
    options: dict[str, Any] = {
        "max_connections": max_connections,
        "decode_responses": False,
        "retry": Retry(retry.backoff(), retries),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 30,
    }
    target = redis_target.parse(url)
    if target.is_sentinel:
        return _sentinel_client(target, options)
    if target.is_cluster:
        return _cluster_client(target, options)
    pool = BlockingConnectionPool.from_url(url, timeout=POOL_WAIT_S, **options)
    return Redis.from_pool(pool)


def _cluster_client(target: redis_target.Target, options: dict[str, Any]) -> Redis:
    """redis-py's cluster client: slots from the nodes, MOVED/ASK and failover followed.

    It offers what the services use of :class:`Redis` (commands, scripts, pipelines, and
    transactions whose keys share a slot), so they take it as one.
    """
    server = _server_options(target)
    server.pop("db", None)
    options = {k: v for k, v in options.items() if k != "retry_on_error"}
    nodes = [ClusterNode(host, port) for host, port in target.cluster]
    return cast(Redis, RedisCluster(startup_nodes=nodes, **server, **options))


def connect_sync(url: str, **options: Any) -> redis.Redis:
    """A blocking client for ``url`` (for a thread that has no event loop, as the exporter's)."""
    target = redis_target.parse(url)
    if target.is_cluster:
        server = {k: v for k, v in _server_options(target).items() if k != "db"}
        nodes = [_SyncClusterNode(host, port) for host, port in target.cluster]
        cluster = redis.cluster.RedisCluster(startup_nodes=nodes, **server, **options)
        return cast(redis.Redis, cluster)
    if not target.is_sentinel:
        return redis.Redis.from_url(url, **options)
    sentinel, server = _sentinel_options(target)
    sentinels = _SyncSentinel(list(target.sentinels), sentinel_kwargs=sentinel, **server)
    client: redis.Redis = sentinels.master_for(target.service, **options)
    return client


def _sentinel_client(target: redis_target.Target, options: dict[str, Any]) -> Redis:
    sentinel, server = _sentinel_options(target)
    sentinels = _Sentinel(list(target.sentinels), sentinel_kwargs=sentinel, **server)
    client: Redis = sentinels.master_for(target.service, redis_class=Redis, **options)
    return client


def _server_options(target: redis_target.Target) -> dict[str, Any]:
    """The URL's options for the servers, less the placeholder address.

    Sentinel or the cluster replaces the address; TLS is ``ssl=True`` (their clients pick
    the connection class).
    """
    server = dict(parse_url(target.url))
    for placeholder in ("host", "port"):
        server.pop(placeholder, None)
    if server.pop("connection_class", None) is SSLConnection:
        server["ssl"] = True
    return server


def _sentinel_options(target: redis_target.Target) -> tuple[dict[str, Any], dict[str, Any]]:
    """The options of the connections to the Sentinels, and to the servers they name."""
    server = _server_options(target)
    sentinel_options = {
        key.removeprefix("sentinel_"): value for key, value in target.sentinel_auth.items()
    }
    tls = {k: v for k, v in server.items() if k == "ssl" or k.startswith("ssl_")}
    return {**tls, **sentinel_options}, server
