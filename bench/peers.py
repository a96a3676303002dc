"""The servers Weir is measured against: the naive baseline and TorchServe (``--peers``).

Both serve the torch models only (the example's ``model.pt``), so they run when the run
measures torch. The baseline needs nothing but this venv; TorchServe needs Java and its own
venv (:mod:`bench.torchserve`), made on the first run that asks for it.

``weir-archives`` is Weir as a TorchServe user runs it: ``weir up --ts-config`` on the
TorchServe peer's own ``config.properties`` and archives, asked through ``/predictions``.
It needs the TorchServe venv (its archiver) but not Java; beside ``torchserve`` it shows
what moving the same archives from TorchServe to Weir does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.analysis import BASELINE, TORCHSERVE, WEIR_ARCHIVES
from bench.servers import ROOT, ServerProcess, baseline_server
from bench.torchserve import ensure_java, ensure_venv, read_settings, settings_record
from bench.torchserve_server import torchserve_server, weir_archives_server
from weir.redis_server import free_port

PEERS = (BASELINE, TORCHSERVE, WEIR_ARCHIVES)
DEFAULT_PEERS = f"{BASELINE},{TORCHSERVE}"
# One venv for every run, whatever its --out: it takes a minute and a GiB to make.
VENV = ROOT / "bench" / "results" / "torchserve-venv"


def parse_peers(text: str) -> list[str]:
    """``baseline,torchserve`` as peers, in the order given; ``none`` or nothing: none."""
    chosen = [w.strip() for w in text.split(",") if w.strip() and w.strip() != "none"]
    unknown = [w for w in chosen if w not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer {unknown[0]!r} (known: {', '.join(PEERS)}, none)")
    return list(dict.fromkeys(chosen))


def prepare_peers(peers: list[str]) -> None:
    """Install what the peers need before anything is measured: Java, TorchServe's venv."""
    if TORCHSERVE in peers:
        ensure_java()
    if TORCHSERVE in peers or WEIR_ARCHIVES in peers:
        ensure_venv(VENV)


class PeerFactory:
    """Makes the peer servers of one run, on the benchmark repository and its models."""

    def __init__(self, repository: Path, models: list[str], out: Path) -> None:
        self.repository = repository
        self.models = models
        self.out = out
        self.record: dict[str, Any] = {}  # how each peer was set up, for the run's record

    def baseline(self, torch_threads: int) -> ServerProcess:
        log = self.out / "logs" / "baseline.log"
        return baseline_server(self.repository, free_port(), torch_threads, log)

    def torchserve(self, worker_threads: int) -> ServerProcess:
        """TorchServe with each model's batching and workers mapped from its Weir config.

        ``worker_threads``: the torch threads one Weir worker has in all.
        """
        models = read_settings(self.repository, self.models, worker_threads)
        self.record[TORCHSERVE] = settings_record(models)
        log = self.out / "logs" / "torchserve.log"
        return torchserve_server(VENV, self.repository, models, self.out / TORCHSERVE, log)

    def weir_archives(self, worker_threads: int) -> ServerProcess:
        """Weir on the archives and ``config.properties`` TorchServe gets (a work directory
        of its own, so the two never share a model store)."""
        models = read_settings(self.repository, self.models, worker_threads)
        work_dir = self.out / WEIR_ARCHIVES
        log = self.out / "logs" / f"{WEIR_ARCHIVES}.log"
        torchserve_server(VENV, self.repository, models, work_dir, log)  # its files only
        return weir_archives_server(work_dir, log)
