"""Real replicated Redis for tests: a primary, its replica and a Sentinel watching them."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import redis

from weir.redis_server import RedisServer, find_redis_server, free_port, wait_for_port

SERVICE = "weir"


class SentinelSet:
    """A primary, one replica and one Sentinel (quorum 1) on loopback ports.

    The Sentinel declares the primary down after ``down_after_ms`` without an answer and
    promotes the replica. ``url`` is the mesh's ``redis+sentinel://`` URL.
    """

    def __init__(self, down_after_ms: int = 1000) -> None:
        self.primary = RedisServer()
        self.replica = RedisServer(extra=("--replicaof", "127.0.0.1", str(self.primary.port)))
        self.sentinel_port = free_port()
        self.down_after_ms = down_after_ms
        self._dir = tempfile.TemporaryDirectory(prefix="weir-sentinel-")
        self._sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}"

    def start(self) -> SentinelSet:
        self.primary.start()
        self.replica.start()
        config = Path(self._dir.name) / "sentinel.conf"  # Sentinel rewrites it: its own file
        config.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self._dir.name}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        self._sentinel = subprocess.Popen(
            [find_redis_server(), str(config), "--sentinel", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for_port(self.sentinel_port, 10)
        self.wait_replicated(10)
        return self

    def primary_port(self) -> int:
        """The port of the server the Sentinel names as primary now."""
        with redis.Redis(port=self.sentinel_port) as sentinel:
            _, port = sentinel.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def wait_replicated(self, timeout_s: float) -> None:
        """Until the replica is in sync and the Sentinel knows it (it can fail over)."""
        deadline = time.monotonic() + timeout_s
        with redis.Redis(port=self.sentinel_port) as sentinel:
            while True:
                replicas = sentinel.sentinel_slaves(SERVICE)
                if any(r.get("master-link-status") == "ok" for r in replicas):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the replica is not in sync after {timeout_s} s")
                time.sleep(0.1)

    def wait_failover(self, old_port: int, timeout_s: float) -> int:
        """Until the Sentinel names another primary, which answers as one; its port."""
        deadline = time.monotonic() + timeout_s
        while True:
            port = self.primary_port()
            if port != old_port:
                with redis.Redis(port=port) as server:
                    role = server.execute_command("ROLE")
                if role[0] == b"master":
                    return port
            if time.monotonic() > deadline:
                raise TimeoutError(f"no failover after {timeout_s} s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._sentinel is not None and self._sentinel.poll() is None:
            self._sentinel.kill()
            self._sentinel.wait()
        self.primary.stop()
        self.replica.stop()
        self._dir.cleanup()

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
