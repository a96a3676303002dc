"""The gateway's response cache settings: Triton's ``--cache-config`` read into them.

``local,size=BYTES`` keeps answers in each gateway process
(``WEIR_GATEWAY_RESPONSE_CACHE_BYTES``); ``redis,host=H`` with ``port``, ``user``,
``password`` and ``db`` (Triton's redis cache keys), or Weir's ``redis,url=redis://...``,
keeps them in a Redis of their own (``WEIR_GATEWAY_RESPONSE_CACHE_REDIS_URL``). What the
cache does: :mod:`gateway.response_cache`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from pydantic import Field
from pydantic_settings import BaseSettings

from weir.errors import ConfigError

REDIS_KEYS = ("host", "port", "user", "password", "db", "url")


class CacheGatewaySettings(BaseSettings):
    """Where the gateway keeps answers for models that enable ``response_cache``."""

    response_cache_bytes: int = Field(
        0,
        ge=0,
        description="bytes of answers each gateway process keeps for models whose config "
        "says response_cache { enable: true } (Triton's --cache-config local,size=N); "
        "0: no cache",
    )
    response_cache_redis_url: str = Field(
        "",
        description="a Redis of its own that keeps the answers for every gateway (Triton's "
        "--cache-config redis,host=H); its maxmemory and eviction policy bound it",
    )
    response_cache_timeout_s: float = Field(
        0.05,
        gt=0,
        description="longest wait for the cache Redis; past it the request goes to the mesh "
        "and the cache is passed by for a second",
    )


def cache_options(flags: list[str]) -> dict[str, Any]:
    """Triton's ``--cache-config CACHE,KEY=VALUE`` flags (repeatable) as gateway settings."""
    local: dict[str, str] = {}
    redis: dict[str, str] = {}
    for flag in flags:
        kind, _, setting = flag.partition(",")
        key, _, value = setting.partition("=")
        if kind == "local" and key == "size" and value.isdigit():
            local[key] = value
        elif kind == "redis" and key in REDIS_KEYS and value:
            redis[key] = value
        else:
            raise ConfigError(
                f"--cache-config {flag}: expected local,size=BYTES or redis,KEY=VALUE "
                f"({', '.join(REDIS_KEYS)})"
            )
    if local and redis:
        raise ConfigError("--cache-config: one cache, local or redis, not both")
    if local:
        return {"response_cache_bytes": int(local["size"])}
    return {"response_cache_redis_url": redis_url(redis)} if redis else {}


def redis_url(keys: dict[str, str]) -> str:
    """A redis:// URL from Triton's redis cache keys (or the ``url`` given)."""
    if "url" in keys:
        return keys["url"]
    if "host" not in keys:
        raise ConfigError("--cache-config redis: give host=H (or url=redis://...)")
    user, password = keys.get("user", ""), keys.get("password", "")
    login = f"{quote(user)}:{quote(password)}@" if password else (f"{quote(user)}@" if user else "")
    return f"redis://{login}{keys['host']}:{keys.get('port', '6379')}/{keys.get('db', '0')}"
