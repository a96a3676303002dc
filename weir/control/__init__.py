"""Model control: what the mesh serves, changed while it serves (Triton's model control modes).

In mode ``none`` every service reads the repository once at start. In ``explicit`` and
``poll`` a desired state in Redis (:mod:`weir.control.desired`) says which models, versions
and configs the mesh serves, with a generation number; the load and unload API or the
repository poller (:mod:`weir.control.controller`) write it, and every gateway, batcher and
worker follows it (:mod:`weir.control.follower`), reporting what it really serves through
its heartbeat (:mod:`weir.workload`).
"""
