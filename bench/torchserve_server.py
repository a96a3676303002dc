"""TorchServe under test: started in the foreground, ready when every worker is, stopped whole.

``torchserve --start --foreground`` keeps its Python launcher waiting on the Java frontend,
which starts one Python worker process per model instance. The bench owns that tree: the
launcher runs in its own session, with a private temporary directory (TorchServe's PID file,
its workers' Unix sockets and the unpacked archives go there, not into ``/tmp``, so another
TorchServe on the machine does not matter), and stopping sends SIGTERM to the frontend, whose
shutdown stops the workers, before whatever is left of the tree is killed by PID.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import psutil

from bench.analysis import TORCHSERVE, WEIR_ARCHIVES
from bench.servers import ServerProcess, http_get
from bench.torchserve import (
    HANDLER,
    LOG4J2_XML,
    Ports,
    TorchServeModel,
    archive,
    config_properties,
)
from weir.redis_server import free_port
from workers.runtime import DEFAULTS as WORKER_ENV

logger = logging.getLogger(__name__)

FRONTEND_CLASS = "org.pytorch.serve.ModelServer"


class TorchServeServer(ServerProcess):
    """TorchServe's frontend and workers serving the archives of ``models``."""

    def __init__(
        self, venv: Path, work_dir: Path, ports: Ports, models: list[TorchServeModel], log: Path
    ) -> None:
        command = [str(venv / "bin" / "torchserve"), "--start", "--foreground", "--ncs"]
        command += ["--model-store", str(work_dir / "model-store")]
        command += ["--ts-config", str(work_dir / "config.properties")]
        command += ["--log-config", str(work_dir / "log4j2.xml")]
        tmp = str(work_dir / "tmp")
        env = {"TEMP": tmp, "TMPDIR": tmp, "LOG_LOCATION": str(work_dir / "logs")}
        env["METRICS_LOCATION"] = env["LOG_LOCATION"]
        # The torch environment a Weir worker runs in (OpenMP threads sleep between
        # batches), so the comparison is about serving, not an OpenMP setting.
        env.update({k: os.environ.get(k, v) for k, v in WORKER_ENV.items()})
        super().__init__(TORCHSERVE, command, ports.inference, log, env, cwd=work_dir)
        self.management_url = f"http://127.0.0.1:{ports.management}"
        self.models = models

    def infer_url(self, model: str) -> str:
        return f"{self.url}/predictions/{model}"

    def is_ready(self) -> bool:
        """The frontend says Healthy and every model has all its workers READY."""
        status, body = http_get(f"{self.url}/ping", 2.0)
        if status != 200 or json.loads(body).get("status") != "Healthy":
            return False
        return all(self.ready_workers(m.name) >= m.workers for m in self.models)

    def ready_workers(self, model: str) -> int:
        status, body = http_get(f"{self.management_url}/models/{model}", 2.0)
        if status != 200:
            return 0
        workers = json.loads(body)[0].get("workers", [])
        return sum(1 for w in workers if w.get("status") == "READY")

    def signal_stop(self, tree: list[psutil.Process]) -> None:
        """SIGTERM to the Java frontend: the launcher only waits on it and would leave it."""
        frontends = [p for p in tree if _is_frontend(p)]
        for process in frontends:
            process.send_signal(signal.SIGTERM)
        if not frontends:
            super().signal_stop(tree)


def _is_frontend(process: psutil.Process) -> bool:
    try:
        return FRONTEND_CLASS in process.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def torchserve_server(
    venv: Path, repository: Path, models: list[TorchServeModel], work_dir: Path, log: Path
) -> TorchServeServer:
    """A fresh work directory (archives, config, log config) and the server to run on it."""
    shutil.rmtree(work_dir / "tmp", ignore_errors=True)
    for name in ("tmp", "logs", "model-store"):
        (work_dir / name).mkdir(parents=True, exist_ok=True)
    store = work_dir / "model-store"
    for model in models:
        fresh_archive(venv, repository, model, store)
    ports = Ports(free_port(), free_port(), free_port(), free_port(), free_port())
    (work_dir / "config.properties").write_text(config_properties(ports, store, models))
    (work_dir / "log4j2.xml").write_text(LOG4J2_XML)
    return TorchServeServer(venv, work_dir, ports, models, log)


def fresh_archive(venv: Path, repository: Path, model: TorchServeModel, store: Path) -> Path:
    """The model's archive, rebuilt only when its settings, model.pt or the handler changed."""
    mar, stamp = store / f"{model.name}.mar", store / f"{model.name}.settings.json"
    settings = json.dumps(model.__dict__, sort_keys=True)
    sources = (repository / model.name / "1" / "model.pt", HANDLER)
    newest = max(path.stat().st_mtime for path in sources)
    fresh = mar.is_file() and mar.stat().st_mtime >= newest
    if fresh and stamp.is_file() and stamp.read_text() == settings:
        return mar
    logger.info("archiving %s for TorchServe", model.name)
    archive(venv, repository, model, store)
    stamp.write_text(settings)
    return mar


class WeirArchivesServer(ServerProcess):
    """``weir up`` as a TorchServe user would run it: the same ``config.properties`` and
    archives as the TorchServe peer, asked through ``/predictions``."""

    def infer_url(self, model: str) -> str:
        return f"{self.url}/predictions/{model}"


def weir_archives_server(work_dir: Path, log: Path) -> WeirArchivesServer:
    """Weir on a TorchServe work directory (:func:`torchserve_server`'s); its own ports."""
    port, redis_port = free_port(), free_port()
    command = [sys.executable, "-m", "weir.cli", "up", "--ts-config"]
    command += [str(work_dir / "config.properties"), "--http-port", str(port)]
    command += ["--ts-management-port", str(free_port()), "--metrics-port", str(free_port())]
    # The TorchServe peer's gRPC ports are in the config.
    command += ["--ts-grpc-inference-port", "0", "--ts-grpc-management-port", "0"]
    command += ["--grpc-port", "0", "--redis-port", str(redis_port)]
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    return WeirArchivesServer(WEIR_ARCHIVES, command, port, log, redis_url=redis_url)
