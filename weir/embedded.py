"""``weir up``: the whole mesh on one machine, no Docker.

Starts a private redis-server, then one gateway, one batcher and one CPU worker pool (more
of each with ``--gateway-processes``, ``--batchers`` and ``--cpu-workers``) as child
processes, each in its own session so that a Ctrl-C reaches only this supervisor. It prints
where it listens once the gateway reports ready; a service that dies before then stops it
all (the mesh cannot start). After that it supervises: a service that dies is started
again, after a backoff that doubles from 1 s up to 30 s while it keeps dying and is
forgotten once it has run a minute, each restart logged; crash safety means no accepted
request is lost meanwhile. On SIGINT/SIGTERM it stops the children in data-flow order
(gateway, batcher, worker, so each drains into a live next stage) and then Redis.

It runs as ``python -m weir.embedded``, which ``weir up`` execs once its settings are read
(:mod:`weir.up_plan`): the supervisor imports no pydantic and nothing of the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time

from weir.redis_server import RedisServer
from weir.service import EXIT_REPLACE, Service, run
from weir.up_plan import PLAN_ENV, UpPlan

logger = logging.getLogger(__name__)

RESTART_BACKOFF_S = (1.0, 30.0)  # first and longest wait before a dead service restarts
STABLE_S = 60.0  # a service that ran this long starts its backoff over


class Embedded(Service):
    """Supervises redis-server and one process per mesh service."""

    name = "weir up"

    def __init__(self, plan: UpPlan) -> None:
        super().__init__(plan.shutdown_grace_s)
        self.plan = plan
        self.redis = RedisServer(plan.redis_port, plan.redis_server, maxmemory=plan.redis_maxmemory)
        self.children: dict[str, asyncio.subprocess.Process] = {}
        self.env: dict[str, str] = {}
        self.exit_code = 0

    def _environment(self) -> dict[str, str]:
        return {**os.environ, **self.plan.child_env, "WEIR_REDIS_URL": self.redis.url}

    async def startup(self) -> None:
        try:
            await asyncio.to_thread(self.redis.start)
            self.env = self._environment()
            for name, args in self._services():
                self.children[name] = await self._spawn(args)
            await self._wait_ready()
        except BaseException:
            # Nothing started may outlive a start that failed: no orphaned service or Redis.
            await self.shutdown()
            raise
        grpc, metrics = self.plan.grpc_port, self.plan.metrics_port
        print(
            f"Weir is up: http://127.0.0.1:{self.plan.http_port}/v2 "
            f"(KServe v2 / Triton HTTP), gRPC {f'127.0.0.1:{grpc}' if grpc else 'off'}, metrics "
            f"{f'http://127.0.0.1:{metrics}/metrics' if metrics else 'off'}, "
            f"repository {self.plan.repository}, redis {self.redis.url}. "
            f"Ctrl-C stops it.",
            flush=True,
        )
        if self.plan.model_store is not None:
            plan = self.plan
            management = plan.ts_management_port
            print(
                f"TorchServe APIs: inference http://127.0.0.1:{plan.http_port}"
                f"/predictions/<model>, gRPC inference {_grpc(plan.ts_grpc_inference_port)}, "
                f"gRPC management {_grpc(plan.ts_grpc_management_port)}, management "
                f"{f'http://127.0.0.1:{management}/models' if management else 'off'}, "
                f"model store {self.plan.model_store}.",
                flush=True,
            )

    async def _wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await _http_ok(self.plan.http_port, "/v2/health/ready"):
            await self._replace_ended()
            if self._dead_child() or time.monotonic() > deadline or self.should_exit.is_set():
                raise RuntimeError(
                    f"the mesh did not become ready ({self._dead_child() or 'timeout'})"
                )
            await asyncio.sleep(0.2)

    async def _replace_ended(self) -> None:
        """Start again, before the mesh is ready, a service that ended itself to be replaced.

        A worker whose start model's load ran past its timeout does (workers.loading); any
        other death before ready stops Weir, since the mesh cannot start.
        """
        for name, args in self._services():
            if self.children[name].returncode == EXIT_REPLACE:
                logger.warning("%s exited to be replaced; starting it again", name)
                self.children[name] = await self._spawn(args)

    def _dead_child(self) -> str | None:
        return next((n for n, p in self.children.items() if p.returncode is not None), None)

    async def _spawn(self, args: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "weir.cli", *args, env=self.env, start_new_session=True
        )

    async def run(self) -> None:
        keepers = [asyncio.ensure_future(self._keep(n, a)) for n, a in self._services()]
        await self.should_exit.wait()
        for keeper in keepers:
            keeper.cancel()
        await asyncio.gather(*keepers, return_exceptions=True)

    async def _keep(self, name: str, args: list[str]) -> None:
        """Start ``name`` again whenever it dies, with a backoff, until Weir exits."""
        backoff_s = RESTART_BACKOFF_S[0]
        started = time.monotonic()
        while True:
            code = await self.children[name].wait()
            if time.monotonic() - started >= STABLE_S:
                backoff_s = RESTART_BACKOFF_S[0]
            logger.warning("%s exited with %s; starting it again in %g s", name, code, backoff_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.should_exit.wait(), backoff_s)
                return  # Weir is stopping: the child stays down
            self.children[name] = await self._spawn(args)
            started = time.monotonic()
            backoff_s = min(backoff_s * 2, RESTART_BACKOFF_S[1])

    def _services(self) -> list[tuple[str, list[str]]]:
        workers = [
            (f"worker-cpu-{i}", ["worker", "--pool", "cpu"])
            for i in range(1, self.plan.cpu_workers + 1)
        ]
        count = self.plan.batchers
        batchers = [
            ("batcher" if count == 1 else f"batcher-{i}", ["batcher"]) for i in range(1, count + 1)
        ]
        return [("gateway", ["gateway"]), *batchers, *workers]

    async def shutdown(self) -> None:
        for name, _ in self._services():
            process = self.children.get(name)
            if process is not None and process.returncode is None:
                await _stop(process, self.plan.shutdown_grace_s + 5)
        await asyncio.to_thread(self.redis.stop)


async def _stop(process: asyncio.subprocess.Process, timeout_s: float) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()


async def _http_ok(port: int, path: str, timeout_s: float = 2.0) -> bool:
    """Whether ``path`` answers 200 on ``port``.

    False too for whatever does not answer within ``timeout_s`` (another program holding
    the port, say), so that waiting for the mesh still sees a service die.
    """
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), timeout_s
        )
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        status = await asyncio.wait_for(reader.readline(), timeout_s)
        return status.split(b" ")[1:2] == [b"200"]
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def _grpc(port: int) -> str:
    return f"127.0.0.1:{port}" if port else "off"


def main() -> int:
    """The supervisor's entry point: the plan ``weir up`` left in the environment."""
    plan = UpPlan.decode(os.environ.pop(PLAN_ENV))
    logging.basicConfig(
        level=plan.log_level.upper(), format="%(asctime)s up %(levelname)s %(name)s: %(message)s"
    )
    service = Embedded(plan)
    run(service)
    return service.exit_code


if __name__ == "__main__":
    sys.exit(main())
