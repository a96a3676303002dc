"""The hot-path link for a ``--redis-url``: one server's (or Sentinel's), or a cluster's."""

from __future__ import annotations

from weir import redis_target
from weir.cluster_link import ClusterLink
from weir.link import REPLY_TIMEOUT_S, HotLink, Link


def open_link(
    url: str, reply_timeout_s: float = REPLY_TIMEOUT_S, identify: bool = False
) -> HotLink:
    """A :class:`~weir.link.Link`, or a :class:`~weir.cluster_link.ClusterLink` for a cluster."""
    if redis_target.parse(url).is_cluster:
        return ClusterLink(url, reply_timeout_s, identify=identify)
    return Link(url, reply_timeout_s, identify=identify)
