"""The bench's ``weir-archives`` peer: Weir on the TorchServe peer's own work directory.

The work directory is made as the bench makes TorchServe's (its ``config.properties``, the
bench handler's archive of ``tiny_mlp``), the archive zipped here rather than by
``torch-model-archiver`` so no TorchServe venv is needed. Weir starts on that file alone,
answers a bench body through ``/predictions`` with the model's outputs, reports its batches,
and leaves no process behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import psutil
import pytest
import yaml

from bench.analysis import WEIR_ARCHIVES
from bench.peers import DEFAULT_PEERS, parse_peers
from bench.servers import ROOT, batch_counts, http_post, process_tree
from bench.torchserve import HANDLER, Ports, config_properties, read_settings
from bench.torchserve_handler import SPEC_FILE
from bench.torchserve_server import weir_archives_server
from bench.workload import write_body
from tests.torchserve.archives import build_archive
from weir.redis_server import free_port

REPOSITORY = ROOT / "examples" / "models"


def test_weir_archives_is_a_peer_to_ask_for() -> None:
    assert parse_peers("torchserve,weir-archives") == ["torchserve", WEIR_ARCHIVES]
    assert parse_peers(DEFAULT_PEERS) == ["baseline", "torchserve"]


def work_dir(root: Path) -> Path:
    """The TorchServe peer's work directory for tiny_mlp, as bench.torchserve_server makes it."""
    store = root / "model-store"
    store.mkdir(parents=True)
    models = read_settings(REPOSITORY, ["tiny_mlp"], 2)
    config = yaml.safe_load((REPOSITORY / "tiny_mlp" / "config.yaml").read_text())
    spec = {
        "name": "tiny_mlp",
        "inputs": [item["name"] for item in config["input"]],
        "outputs": [item["name"] for item in config["output"]],
        "torch_threads": models[0].torch_threads,
    }
    build_archive(
        store,
        "tiny_mlp",
        HANDLER.read_text(),
        serialized_file=REPOSITORY / "tiny_mlp" / "1" / "model.pt",
        extra_files={SPEC_FILE: json.dumps(spec)},
        handler_file=HANDLER.name,
    )
    ports = Ports(*(free_port() for _ in range(5)))
    (root / "config.properties").write_text(config_properties(ports, store, models))
    return root


@pytest.mark.timeout(90)
def test_weir_serves_the_torchserve_peers_archives_through_predictions(tmp_path: Path) -> None:
    if not (REPOSITORY / "tiny_mlp" / "1" / "model.pt").is_file():
        pytest.skip("examples/build_models.py has not built tiny_mlp")
    server = weir_archives_server(work_dir(tmp_path / "ts"), tmp_path / "weir-archives.log")
    assert server.name == WEIR_ARCHIVES
    server.start()
    try:
        server.wait_ready(60)
        tree = process_tree(server.pid)
        body = write_body(REPOSITORY, "tiny_mlp", tmp_path / "body.json").read_bytes()
        assert server.infer_url("tiny_mlp") == f"{server.url}/predictions/tiny_mlp"
        status, answer = http_post(server.infer_url("tiny_mlp"), body)
        inferences, executions = batch_counts(server, "tiny_mlp")
    finally:
        server.stop()
    assert status == 200, answer[:300]
    assert orjson.loads(answer)["outputs"][0]["shape"] == [1, 16]
    assert (inferences, executions) == (1, 1)
    assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
