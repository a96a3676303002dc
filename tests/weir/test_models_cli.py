"""``weir models list|load|unload|weights`` as a shell runs it, against a mesh in mode explicit.

One mesh for the module, on its own redis-server, with a management token, over tiny_mlp,
tiny_mlp_onnx and ``tiny_two``: tiny_mlp's weights served as two versions, so traffic
weights decide which version answers.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.chaos.helpers import private_repository
from tests.conftest import EXAMPLES, ROOT, Mesh, private_mesh

TOKEN = "cli-admin-secret"
TOKEN_ENV = "WEIR_GATEWAY_MANAGEMENT_TOKEN"


def write_two_versions(repository: Path) -> None:
    """``tiny_two``: tiny_mlp's config and weights, as versions 1 and 2, both served."""
    config = yaml.safe_load((EXAMPLES / "tiny_mlp" / "config.yaml").read_text())
    config.update(name="tiny_two", version_policy={"all": {}})
    for version in ("1", "2"):
        target = repository / "tiny_two" / version
        target.mkdir(parents=True)
        shutil.copy(EXAMPLES / "tiny_mlp" / "1" / "model.pt", target / "model.pt")
    (repository / "tiny_two" / "config.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def cli_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("cli") / "models"
    repository = private_repository(EXAMPLES, root, ["tiny_mlp", "tiny_mlp_onnx"])
    write_two_versions(repository)
    env = {
        "WEIR_MODEL_CONTROL_MODE": "explicit",
        "WEIR_LOAD_MODEL": "tiny_mlp,tiny_two",
        TOKEN_ENV: TOKEN,
        "WEIR_SHUTDOWN_GRACE_S": "2",  # nothing is in flight when the module ends
    }
    with private_mesh(repository, env) as running:
        yield running


def weir_models(
    mesh: Mesh, *args: str, token: str | None = TOKEN, env_token: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m weir.cli models ARGS --url ...``, with ``--token`` or the env's token."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    if env_token is not None:
        env[TOKEN_ENV] = env_token
    command = [sys.executable, "-m", "weir.cli", "models", *args, "--url", mesh.url]
    if token is not None:
        command += ["--token", token]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def index(mesh: Mesh) -> dict[str, dict[str, Any]]:
    response = httpx.post(
        f"{mesh.url}/v2/repository/index",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return {f"{m['name']}:{m.get('version', '')}": m for m in response.json()}


def answering_versions(mesh: Mesh, model: str, requests: int) -> set[str]:
    """Which versions answered ``requests`` inferences that named no version."""
    row = np.random.default_rng(0).standard_normal(64, dtype=np.float32)
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": row.tolist()}
    body = {"inputs": [tensor]}
    versions = set()
    for _ in range(requests):
        response = httpx.post(f"{mesh.url}/v2/models/{model}/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        versions.add(response.json()["model_version"])
    return versions


def test_list_prints_each_model_with_its_version_state_and_reason(cli_mesh: Mesh) -> None:
    result = weir_models(cli_mesh, "list")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["MODEL", "VERSION", "STATE", "REASON"]
    assert re.search(r"^tiny_mlp +1 +READY *$", result.stdout, re.M), result.stdout
    assert re.search(r"^tiny_two +1 +READY *$", result.stdout, re.M), result.stdout
    assert re.search(r"^tiny_two +2 +READY *$", result.stdout, re.M), result.stdout
    assert re.search(r"^tiny_mlp_onnx +UNAVAILABLE +not loaded$", result.stdout, re.M)


def test_load_serves_a_model_and_unload_stops_it(cli_mesh: Mesh) -> None:
    loaded = weir_models(cli_mesh, "load", "tiny_mlp_onnx")

    assert (loaded.returncode, loaded.stdout, loaded.stderr) == (0, "tiny_mlp_onnx: loaded\n", "")
    assert index(cli_mesh)["tiny_mlp_onnx:1"]["state"] == "READY"
    assert answering_versions(cli_mesh, "tiny_mlp_onnx", 1) == {"1"}

    unloaded = weir_models(cli_mesh, "unload", "tiny_mlp_onnx")

    assert (unloaded.returncode, unloaded.stdout) == (0, "tiny_mlp_onnx: unloaded\n")
    assert index(cli_mesh)["tiny_mlp_onnx:"]["reason"] == "unloaded"
    listed = weir_models(cli_mesh, "list").stdout
    assert re.search(r"^tiny_mlp_onnx +UNAVAILABLE +unloaded$", listed, re.M), listed


def test_load_with_a_config_serves_that_config(cli_mesh: Mesh) -> None:
    config = (
        '{"name": "tiny_mlp_onnx", "platform": "onnxruntime_onnx", "max_batch_size": 8,'
        ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]}],'
        ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}'
    )
    result = weir_models(cli_mesh, "load", "tiny_mlp_onnx", "--config", config)
    try:
        assert result.returncode == 0, result.stderr
        served = httpx.get(f"{cli_mesh.url}/v2/models/tiny_mlp_onnx/config", timeout=30).json()
        assert served["max_batch_size"] == 8
    finally:
        weir_models(cli_mesh, "unload", "tiny_mlp_onnx")


def test_weights_decide_which_version_answers_a_request_naming_none(cli_mesh: Mesh) -> None:
    to_one = weir_models(cli_mesh, "weights", "tiny_two", "1=100")
    try:
        assert (to_one.returncode, to_one.stdout) == (0, "tiny_two: traffic weights {'1': 100}\n")
        assert answering_versions(cli_mesh, "tiny_two", 8) == {"1"}

        split = weir_models(cli_mesh, "weights", "tiny_two", "1=0", "2=100")

        assert split.returncode == 0, split.stderr
        assert answering_versions(cli_mesh, "tiny_two", 8) == {"2"}
    finally:
        cleared = weir_models(cli_mesh, "weights", "tiny_two")
    assert (cleared.returncode, cleared.stdout) == (0, "tiny_two: traffic weights cleared\n")


def test_an_unknown_model_exits_1_with_the_gateways_message(cli_mesh: Mesh) -> None:
    load = weir_models(cli_mesh, "load", "no_such_model")
    weights = weir_models(cli_mesh, "weights", "no_such_model", "1=100")

    assert load.returncode == 1 and load.stdout == ""
    assert load.stderr == (
        f"weir models load: failed to load 'no_such_model': {cli_mesh.repository}: "
        "no model directory named 'no_such_model'\n"
    )
    assert weights.returncode == 1
    assert weights.stderr == "weir models weights: model 'no_such_model' is not loaded\n"


def test_weights_for_a_version_not_served_exit_1_and_change_nothing(cli_mesh: Mesh) -> None:
    result = weir_models(cli_mesh, "weights", "tiny_two", "3=100")

    assert result.returncode == 1
    assert "traffic weights name versions 3, which are not served" in result.stderr
    assert answering_versions(cli_mesh, "tiny_two", 4) == {"2"}


def test_the_management_token_comes_from_the_flag_or_the_environment(cli_mesh: Mesh) -> None:
    anonymous = weir_models(cli_mesh, "list", token=None)
    from_env = weir_models(cli_mesh, "list", token=None, env_token=TOKEN)

    assert anonymous.returncode == 1
    assert anonymous.stderr == (
        "weir models list: this management route needs a valid bearer token\n"
    )
    assert from_env.returncode == 0, from_env.stderr
    assert "tiny_mlp" in from_env.stdout


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["load"], 2, "weir models load: name a model\n"),
        (
            ["weights", "tiny_two", "2:100"],
            1,
            "weir models weights: '2:100': write VERSION=WEIGHT\n",
        ),
    ],
)
def test_a_malformed_command_is_refused_before_any_call(
    cli_mesh: Mesh, args: list[str], status: int, message: str
) -> None:
    result = weir_models(cli_mesh, *args)

    assert (result.returncode, result.stderr) == (status, message)
