"""Where the mesh's Redis is: one server, a primary that Redis Sentinel names, or a cluster.

``--redis-url`` (``WEIR_REDIS_URL``) takes redis-py's URLs for one server (``redis://``,
``rediss://`` for TLS, ``unix://``) and, for a primary/replica set watched by Sentinel::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?options]

The hosts are Sentinels (port 26379 when none is given), ``service_name`` is the name they
monitor the primary under (``sentinel monitor <name> ...``), and the user and password are
the Redis servers' own, as in a plain URL. ``rediss+sentinel://`` speaks TLS to the servers
and the Sentinels. Two options are the Sentinels' own and go to them only:
``sentinel_username`` and ``sentinel_password``; every other option (``ssl_ca_certs``,
``socket_timeout``, ...) is redis-py's, as in a plain URL.

For a Redis Cluster::

    redis+cluster://[[user]:password@]host[:port][,host[:port]...][/0][?options]

The hosts are some of the cluster's nodes (port 6379 when none is given; one is enough,
more in case it is down): the clients learn the others, and which slots each serves, from
them. ``rediss+cluster://`` speaks TLS; the options are redis-py's, as in a plain URL.

Each connection asks the Sentinels for the primary's address when it connects, and checks
that the server it reached says it is the primary (``ROLE``), so after a failover every
service reconnects to the promoted replica on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from weir.redis_io import cluster_slots

SENTINEL_SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
SENTINEL_PORT = 26379
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
CLUSTER_PORT = 6379
# The options that are the Sentinels' own, taken out of the servers' URL.
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True)
class Target:
    """A parsed ``--redis-url``.

    ``url`` is a URL redis-py reads. For Sentinel it carries the servers' credentials, TLS
    and options, and a placeholder host and port that the Sentinels' answer replaces.
    """

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_auth: dict[str, str] = field(default_factory=dict)
    # A cluster's startup nodes: any of its nodes, which tell where the others are.
    cluster: tuple[tuple[str, int], ...] = ()

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)

    @property
    def is_cluster(self) -> bool:
        return bool(self.cluster)


def parse(url: str) -> Target:
    """``url`` as a :class:`Target`; ValueError, saying what is wrong, for a bad URL."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() in CLUSTER_SCHEMES:
        return _parse_cluster(url)
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        return Target(url)
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    sentinels = tuple(_address(host, url) for host in hosts.split(",") if host)
    if not sentinels:
        raise ValueError(f"the Redis URL {_safe(url)} names no Sentinel host")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(
            f"the Redis URL {_safe(url)} must name the service Sentinel monitors, as "
            "redis+sentinel://host:26379/<service_name>[/<db>]"
        )
    db = path[1] if len(path) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"the Redis URL {_safe(url)} has database {db!r}, not a number")
    query = parse_qsl(parts.query, keep_blank_values=True)
    auth = {k: v for k, v in query if k in SENTINEL_OPTIONS}
    rest = urlencode([(k, v) for k, v in query if k not in SENTINEL_OPTIONS])
    server = SENTINEL_SCHEMES[scheme.lower()]
    credentials = userinfo + at
    # The placeholder is never dialled: every connection asks the Sentinels first.
    plain = f"{server}://{credentials}sentinel-primary:6379/{db}" + (f"?{rest}" if rest else "")
    return Target(plain, sentinels, path[0], auth)


def _parse_cluster(url: str) -> Target:
    nodes, plain = parse_cluster_url(url)
    return Target(plain, cluster=tuple(nodes))


def parse_cluster_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """The startup nodes of a ``redis+cluster://`` URL, and its nodes' URL template.

    The template is a plain ``redis://`` (``rediss://``) URL with the credentials and
    options, on a placeholder host (:func:`weir.redis_io.cluster_slots.node_url` puts a
    node's address in). ValueError, saying what is wrong (the password hidden), for a bad URL.
    """
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError(f"the Redis URL {_safe(url)} is no redis+cluster:// URL")
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes = [_address(host, url, CLUSTER_PORT) for host in hosts.split(",") if host]
    if not nodes:
        raise ValueError(f"the Redis URL {_safe(url)} names no cluster node")
    db = parts.path.strip("/")
    if db not in ("", "0"):
        raise ValueError(
            f"the Redis URL {_safe(url)} names database {db!r}: a Redis Cluster has only 0"
        )
    server = CLUSTER_SCHEMES[scheme.lower()]
    query = f"?{parts.query}" if parts.query else ""
    host = cluster_slots.PLACEHOLDER_HOST
    return nodes, f"{server}://{userinfo}{at}{host}:{CLUSTER_PORT}/0{query}"


def _address(host: str, url: str, default_port: int = SENTINEL_PORT) -> tuple[str, int]:
    if host.startswith("["):  # [ipv6]:port
        name, _, port = host[1:].partition("]")
        port = port.removeprefix(":")
    else:
        name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    if not name or (port and not port.isdigit()):
        raise ValueError(f"the Redis URL {_safe(url)} has a bad port in {host!r}")
    return name, int(port) if port else default_port


def _safe(url: str) -> str:
    """``url`` without its password, for an error message."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at:
        return url
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()
