"""``weir up``'s TorchServe options: config.properties under the command line, --models."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.torchserve.archives import build_archive
from weir.config_parameters import LOAD_TIMEOUT_S
from weir.control.mode import ControlMode
from weir.errors import ConfigError
from weir.repository import load_model
from weir.torchserve.startup import prepare
from weir.torchserve.store import ModelStore
from weir.up_settings import UpSettings


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    for name in ("alpha", "beta"):
        build_archive(root, name)
    return root


def test_models_all_registers_every_archive_and_loads_them_explicitly(store: Path) -> None:
    settings = prepare(UpSettings(model_store=store, models=["all"]), False, {})
    assert settings.model_control_mode is ControlMode.EXPLICIT
    assert settings.repository == store / ".weir"
    assert settings.load_models == ["alpha", "beta"]
    assert ModelStore(store, settings.repository).models() == ["alpha", "beta"]


def test_a_new_start_forgets_the_registrations_of_the_last(store: Path) -> None:
    prepare(UpSettings(model_store=store, models=["all"]), False, {})
    settings = prepare(UpSettings(model_store=store, models=["one=alpha.mar"]), False, {})
    assert settings.load_models == ["one"]
    assert ModelStore(store, settings.repository).models() == ["one"]


def test_the_command_line_wins_over_config_properties(
    store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.properties"
    config.write_text(
        "inference_address=http://0.0.0.0:9080\n"
        "management_address=http://0.0.0.0:9081\n"
        f"model_store={store}\n"
        "load_models=beta.mar\n"
        "max_request_size=1000\n"
        "install_py_dep_per_model=true\n"
        "decode_input_request=false\n"
        "default_response_timeout=300\n"
        "default_startup_timeout=400\n"
        "job_queue_size=30\n"
        "number_of_netty_threads=4\n"
    )
    caplog.set_level(logging.WARNING, "weir.torchserve.startup")
    settings = prepare(UpSettings(ts_config=config, http_port=7000), False, {})
    assert settings.http_port == 7000  # given on the command line
    assert settings.ts_management_port == 9081
    assert settings.ts_management_host == "0.0.0.0"
    assert settings.ts_max_request_size_bytes == 1000
    assert settings.ts_install_requirements is True
    assert settings.ts_decode_input_request is False
    assert settings.ts_default_response_timeout_s == 300
    assert settings.ts_default_startup_timeout_s == 400
    assert settings.model_store == store
    assert settings.load_models == ["beta"]
    # The start archives take them as their timeouts (they set none of their own).
    config_of_beta = ModelStore(store, settings.repository).describe("beta").versions[0]
    assert config_of_beta.response_timeout_s == 300
    assert config_of_beta.startup_timeout_s == 400
    parameters = load_model(settings.repository, "beta").config.parameters
    assert parameters[LOAD_TIMEOUT_S] == "400"
    assert settings.ts_job_queue_size == 30
    assert "keys Weir ignores: number_of_netty_threads" in caplog.text


def test_an_explicit_repository_is_used_and_its_own_models_survive(
    store: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "models"
    (repository / "mine" / "1").mkdir(parents=True)
    settings = prepare(
        UpSettings(model_store=store, models=["alpha.mar"], repository=repository), True, {}
    )
    assert settings.repository == repository
    assert sorted(p.name for p in repository.iterdir() if not p.name.startswith(".")) == [
        "alpha",
        "mine",
    ]


def test_models_without_a_store_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="--models needs a model store"):
        prepare(UpSettings(models=["alpha.mar"]), False, {})


def test_models_items_may_list_several_separated_by_commas(store: Path) -> None:
    # As TorchServe's frontend, which joins --models by commas and splits load_models on them.
    models = ["one=alpha.mar,two=beta.mar", "alpha.mar"]
    settings = prepare(UpSettings(model_store=store, models=models), False, {})
    assert settings.load_models == ["one", "two", "alpha"]
    with pytest.raises(ConfigError, match=r"--models: '=beta.mar' is neither"):
        prepare(UpSettings(model_store=store, models=["=beta.mar"]), False, {})
