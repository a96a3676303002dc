"""A real Redis Cluster for tests: three primaries and a replica each, on loopback ports."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from weir.redis_server import RedisServer, free_port

POLL_S = 0.05


class ClusterSet:
    """Three primaries and three replicas of Debian's ``redis-server``, made a cluster.

    A replica takes over a primary that does not answer for ``node_timeout_ms``. ``url`` is
    the mesh's ``redis+cluster://`` URL, naming the three primaries it started with.
    """

    def __init__(self, node_timeout_ms: int = 1000) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="weir-cluster-")
        self.nodes = [self._node(node_timeout_ms) for _ in range(6)]
        self._first_primaries: list[int] = []
        self._primary_of_replica: dict[int, int] = {}  # replica port -> its primary's

    def _node(self, node_timeout_ms: int) -> RedisServer:
        server = RedisServer()
        # Each node rewrites its own cluster state file: one per node, in a folder we own.
        config = Path(self._dir.name) / f"nodes-{server.port}.conf"
        server.extra = (
            "--cluster-enabled", "yes", "--cluster-config-file", str(config),
            "--cluster-node-timeout", str(node_timeout_ms), "--cluster-port", str(free_port()),
            "--repl-diskless-sync-delay", "0",
        )  # fmt: skip
        return server

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self._first_primaries)
        return f"redis+cluster://{hosts}"

    def start(self, timeout_s: float = 30.0) -> ClusterSet:
        try:
            for node in self.nodes:
                node.start()
            self._create()
            self.wait(self._healthy, timeout_s, "the cluster to be up and its replicas in sync")
        except BaseException:
            self.stop()
            raise
        self._first_primaries = sorted(self._primary_ports())
        for node in self.nodes:
            replication = self.info(node.port, "replication")
            if replication["role"] == "slave":
                self._primary_of_replica[node.port] = int(replication["master_port"])
        return self

    def _create(self) -> None:
        redis_cli = shutil.which("redis-cli")
        if redis_cli is None:
            raise FileNotFoundError("no redis-cli on PATH (apt-get install redis-tools)")
        created = subprocess.run(
            [redis_cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if created.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed: {created.stdout}{created.stderr}"
            )

    def live(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    def command(self, port: int, *args: Any) -> Any:
        """One command's reply from the node on ``port`` (a fresh connection)."""
        with self.client(port) as client:
            return client.execute_command(*args)

    def info(self, port: int, section: str) -> dict[str, Any]:
        with self.client(port) as client:
            return client.info(section)  # type: ignore[no-any-return]

    def cluster_state(self, port: int) -> str:
        text: str = self.command(port, "CLUSTER", "INFO").decode()
        return next(line for line in text.splitlines() if line.startswith("cluster_state:"))[14:]

    def slots(self, port: int) -> list[tuple[int, int, int]]:
        """``(first, last, primary port)`` of each slot range, as the node on ``port`` sees."""
        return [
            (int(r[0]), int(r[1]), int(r[2][1])) for r in self.command(port, "CLUSTER", "SLOTS")
        ]

    def _primary_ports(self) -> set[int]:
        return {port for _, _, port in self.slots(self.live()[0].port)}

    def primary_of(self, key: str | bytes) -> RedisServer:
        """The node that serves ``key``'s slot now, as the first live node sees it."""
        slot = key_slot(key.encode() if isinstance(key, str) else key)
        for first, last, port in self.slots(self.live()[0].port):
            if first <= slot <= last:
                return self.node(port)
        raise LookupError(f"no primary serves slot {slot}")

    def node_id(self, port: int) -> str:
        return str(self.command(port, "CLUSTER", "MYID").decode())

    def _healthy(self) -> bool:
        live = self.live()
        if any(self.cluster_state(n.port) != "ok" for n in live):
            return False
        for node in live:
            replication = self.info(node.port, "replication")
            if replication.get("role") == "slave" and (
                replication.get("master_link_status") != "up"
                or replication.get("master_sync_in_progress") != 0
            ):
                return False
        return all(_covers_all(self.slots(n.port)) for n in live)

    def wait_failover(self, old_primary_port: int, timeout_s: float) -> int:
        """Until a replica serves the slots of the primary on ``old_primary_port``; its port.

        Every live node must see the cluster ``ok``, with every slot served and none by the
        old primary, and the new primary must say it is one.
        """
        replicas = [r for r, p in self._primary_of_replica.items() if p == old_primary_port]

        def moved() -> bool:
            live = self.live()
            if any(self.cluster_state(n.port) != "ok" for n in live):
                return False
            views = [self.slots(n.port) for n in live]
            return all(_covers_all(v) and old_primary_port not in _ports(v) for v in views)

        def promoted() -> int | None:
            serving = _ports(self.slots(self.live()[0].port))
            return next((r for r in replicas if r in serving), None)

        what = f"a replica to take over from port {old_primary_port}"
        self.wait(lambda: moved() and promoted() is not None, timeout_s, what)
        new_port = promoted()
        if new_port is None:
            raise TimeoutError(what)
        self.wait(lambda: self.command(new_port, "ROLE")[0] == b"master", timeout_s, what)
        del self._primary_of_replica[new_port]
        return new_port

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``condition`` (a node refusing counts as false); TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if condition():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(POLL_S)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self._dir.cleanup()

    def __enter__(self) -> ClusterSet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def _ports(ranges: list[tuple[int, int, int]]) -> set[int]:
    return {port for _, _, port in ranges}


def _covers_all(ranges: list[tuple[int, int, int]]) -> bool:
    return sum(last - first + 1 for first, last, _ in ranges) == 16384
