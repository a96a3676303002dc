"""TorchServe as the bench's peer: the config mapping, its handler, and (when Java and the
bench's TorchServe venv are here) a real start, answer and stop."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import psutil
import pytest
import torch

from bench.peers import VENV, parse_peers
from bench.servers import ROOT, http_post, process_tree
from bench.torchserve import (
    Ports,
    TorchServeModel,
    config_properties,
    model_settings,
    models_property,
    read_settings,
    requirements,
)
from bench.torchserve_handler import SPEC_FILE, BenchHandler

TINY: dict[str, Any] = {
    "name": "tiny_mlp",
    "max_batch_size": 64,
    "dynamic_batching": {"max_queue_delay_microseconds": 2000},
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
}


def test_batch_size_delay_and_workers_come_from_the_weir_config() -> None:
    assert model_settings(TINY, 2) == TorchServeModel("tiny_mlp", 64, 2, 1, 2)


def test_a_preferred_batch_size_is_the_batch_weir_forms_and_instances_share_threads() -> None:
    bert = {
        **TINY,
        "name": "bert_mini",
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 2000},
        "instance_group": [{"count": 2}],
    }
    assert model_settings(bert, 2) == TorchServeModel("bert_mini", 8, 2, 2, 1)
    # Never fewer than one thread per worker.
    assert model_settings(bert, 1).torch_threads == 1


def test_without_dynamic_batching_each_request_runs_alone() -> None:
    plain = {"name": "m", "max_batch_size": 8, "instance_group": [{"count": 1}, {"count": 2}]}
    settings = model_settings(plain, 6)
    assert (settings.batch_size, settings.max_batch_delay_ms) == (1, 0)
    assert (settings.workers, settings.torch_threads) == (3, 2)


@pytest.mark.parametrize(("delay_us", "delay_ms"), [(0, 0), (300, 1), (2000, 2), (2600, 3)])
def test_a_delay_is_whole_milliseconds_and_a_nonzero_one_stays_nonzero(
    delay_us: int, delay_ms: int
) -> None:
    config = {**TINY, "dynamic_batching": {"max_queue_delay_microseconds": delay_us}}
    assert model_settings(config, 2).max_batch_delay_ms == delay_ms


def test_the_example_configs_map_as_the_readme_says() -> None:
    models = read_settings(ROOT / "examples" / "models", ["tiny_mlp", "wide_mlp", "bert_mini"], 2)
    assert [(m.batch_size, m.max_batch_delay_ms, m.workers, m.torch_threads) for m in models] == [
        (64, 2, 1, 2),
        (64, 2, 2, 1),
        (8, 2, 2, 1),
    ]


def test_config_properties_bind_loopback_and_register_each_archive_with_its_batching() -> None:
    model = TorchServeModel("tiny_mlp", 64, 2, 1, 2)
    text = config_properties(Ports(1, 2, 3, 4, 5), Path("/store"), [model])
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["inference_address"] == "http://127.0.0.1:1"
    assert props["management_address"] == "http://127.0.0.1:2"
    assert (props["grpc_inference_port"], props["grpc_management_port"]) == ("4", "5")
    assert props["load_models"] == "tiny_mlp.mar"
    assert props["disable_token_authorization"] == "true"
    version = json.loads(props["models"])["tiny_mlp"]["1.0"]
    assert version["marName"] == "tiny_mlp.mar"
    assert (version["batchSize"], version["maxBatchDelay"]) == (64, 2)
    assert (version["minWorkers"], version["maxWorkers"]) == (1, 1)
    assert json.loads(models_property([model])) == json.loads(props["models"])


def test_the_torchserve_venv_pins_this_venvs_torch_release() -> None:
    torch_release = importlib.metadata.version("torch").split("+")[0]
    assert f"torch=={torch_release}" in requirements()
    assert "torchserve==0.12.0" in requirements()


def test_peers_parse_in_order_and_none_means_weir_alone() -> None:
    assert parse_peers("torchserve, baseline,torchserve") == ["torchserve", "baseline"]
    assert parse_peers("none") == []
    with pytest.raises(ValueError, match="unknown peer 'triton'"):
        parse_peers("baseline,triton")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    module = torch.jit.script(torch.nn.Linear(4, 3))
    module.save(str(tmp_path / "model.pt"))
    spec = {"name": "lin", "inputs": ["INPUT0"], "outputs": ["OUTPUT0"], "torch_threads": 0}
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))
    return tmp_path


def _request(rows: np.ndarray) -> dict[str, Any]:
    item = {"name": "INPUT0", "datatype": "FP32", "shape": list(rows.shape)}
    return {"body": orjson.dumps({"inputs": [{**item, "data": rows.ravel().tolist()}]})}


def test_the_handler_runs_a_batch_in_one_pass_and_answers_each_request(model_dir: Path) -> None:
    handler = BenchHandler()
    handler.initialize(SimpleNamespace(system_properties={"model_dir": str(model_dir)}))
    first, second = np.ones((1, 4), np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)
    answers = [orjson.loads(a) for a in handler.handle([_request(first), _request(second)], None)]
    module = torch.jit.load(str(model_dir / "model.pt"))
    for rows, answer in zip((first, second), answers, strict=True):
        [output] = answer["outputs"]
        assert (answer["model_name"], output["name"], output["datatype"]) == (
            "lin",
            "OUTPUT0",
            "FP32",
        )
        assert output["shape"] == [len(rows), 3]
        expected = module(torch.from_numpy(rows)).detach().numpy()
        np.testing.assert_allclose(np.asarray(output["data"]).reshape(-1, 3), expected, rtol=1e-6)


@pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe's frontend needs java")
@pytest.mark.skipif(
    not (VENV / "bin" / "torchserve").is_file(),
    reason="no TorchServe venv: a bench run with --peers torchserve makes it",
)
@pytest.mark.timeout(90)
def test_torchserve_serves_a_bench_body_and_stops_without_leaving_a_process(
    tmp_path: Path,
) -> None:
    from bench.torchserve_server import torchserve_server
    from bench.workload import write_body

    repository = ROOT / "examples" / "models"
    if not (repository / "tiny_mlp" / "1" / "model.pt").is_file():
        pytest.skip("examples/build_models.py has not built tiny_mlp")
    models = read_settings(repository, ["tiny_mlp"], 2)
    server = torchserve_server(VENV, repository, models, tmp_path / "ts", tmp_path / "ts.log")
    server.start()
    try:
        server.wait_ready(60)
        tree = process_tree(server.pid)
        body = write_body(repository, "tiny_mlp", tmp_path / "body.json").read_bytes()
        status, answer = http_post(server.infer_url("tiny_mlp"), body)
    finally:
        server.stop()
    assert status == 200, answer[:300]
    assert orjson.loads(answer)["outputs"][0]["shape"] == [1, 16]
    assert len(tree) == 3  # launcher, Java frontend, one worker
    assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
