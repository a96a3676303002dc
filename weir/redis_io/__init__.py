"""Weir's one Redis boundary: every connection the services make to Redis starts here.

- :mod:`~weir.redis_io.redis_target`: what ``--redis-url`` names (one server, a primary
  that Sentinel watches, a cluster).
- :mod:`~weir.redis_io.connection`: redis-py clients for everything off the hot path.
- :mod:`~weir.redis_io.link`, :mod:`~weir.redis_io.cluster_link` (with
  :mod:`~weir.redis_io.cluster_slots`), :mod:`~weir.redis_io.links`: the hot path's own
  connections, commands packed by hand and replies parsed by hiredis.
- :mod:`~weir.redis_io.fanin`: blocking reads of many streams, split per cluster slot.
- :mod:`~weir.redis_io.retry`: the one backoff every retry loop and client uses.

What the services send over them is written in :mod:`weir.stages` and :mod:`weir.names`.
"""
