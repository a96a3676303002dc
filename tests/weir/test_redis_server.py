"""A redis-server that cannot start leaves nothing behind and says why, in its own words.

A failed start used to leave its Popen to the garbage collector while the process might still
run, and a ResourceWarning then failed whichever unrelated test was running when it was
collected. A real redis-server on a port that another socket holds.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from weir import redis_server
from weir.ports import free_port
from weir.redis_server import RedisServer


def test_a_server_that_cannot_take_its_port_is_reported_and_leaves_nothing() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # bound, not listening: the port is taken, nothing answers
        port = holder.getsockname()[1]
        server = RedisServer(port=port)
        data = Path(server._dir.name)
        with pytest.raises(TimeoutError, match=rf"port {port} \(exited with 1\)") as failed, server:
            pass
        assert "Address already in use" in str(failed.value)  # its own log says why
        assert server.process is not None and server.process.returncode == 1
        assert not data.exists()


def test_a_port_of_its_own_choosing_taken_before_it_binds_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))  # taken between being found free and being bound
        taken = holder.getsockname()[1]
        handed = iter([taken])
        monkeypatch.setattr(redis_server, "free_port", lambda: next(handed, None) or free_port())
        with RedisServer() as server:
            assert server.port != taken
            with redis.Redis(port=server.port) as client:
                assert client.ping()
