"""The hot-path link for a ``--redis-url``: one server's (or Sentinel's), or a cluster's."""

from __future__ import annotations

from weir.redis_io import redis_target
from weir.redis_io.cluster_link import ClusterLink
from weir.redis_io.link import REPLY_TIMEOUT_S, HotLink, Link


def open_link(
    url: str, reply_timeout_s: float = REPLY_TIMEOUT_S, identify: bool = False
) -> HotLink:
    """A :class:`~weir.redis_io.link.Link`; for a cluster, a :class:`ClusterLink`."""
    if redis_target.parse(url).is_cluster:
        return ClusterLink(url, reply_timeout_s, identify=identify)
    return Link(url, reply_timeout_s, identify=identify)
