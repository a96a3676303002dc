"""Reading TorchServe's config.properties: Java properties syntax and the typed keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from weir.torchserve.properties import (
    Address,
    ModelVersionSettings,
    PropertiesError,
    StartupModel,
    parse_properties,
    parse_properties_text,
)

DOCS_EXAMPLE = """\
# TorchServe's documented example
inference_address=http://0.0.0.0:8080
management_address=http://0.0.0.0:8081
metrics_address=http://0.0.0.0:8082
model_store=/opt/ml/model-store
load_models=noop=noop.mar, vgg16.mar
default_workers_per_model=2
max_request_size=10485760
max_response_size=20971520
number_of_netty_threads=4
job_queue_size=1000
models={\\
  "noop": {\\
    "1.0": {\\
        "defaultVersion": true,\\
        "marName": "noop.mar",\\
        "minWorkers": 1,\\
        "maxWorkers": 1,\\
        "batchSize": 4,\\
        "maxBatchDelay": 100,\\
        "responseTimeout": 120,\\
        "parallelLevel": 2\\
    }\\
  }\\
}
"""


def test_the_documented_example_is_read_into_typed_settings() -> None:
    props = parse_properties_text(DOCS_EXAMPLE, "config.properties")
    assert props.inference_address == ("0.0.0.0", 8080)
    assert props.management_address == Address("0.0.0.0", 8081)
    assert props.metrics_address == Address("0.0.0.0", 8082)
    assert props.model_store == Path("/opt/ml/model-store")
    assert props.load_models == [StartupModel("noop.mar", "noop"), StartupModel("vgg16.mar")]
    assert props.default_workers_per_model == 2
    assert (props.max_request_size, props.max_response_size) == (10485760, 20971520)
    assert props.models == {
        "noop": {
            "1.0": ModelVersionSettings(
                default_version=True,
                mar_name="noop.mar",
                min_workers=1,
                max_workers=1,
                batch_size=4,
                max_batch_delay_ms=100,
                response_timeout_s=120,
                other={"parallelLevel": 2},
            )
        }
    }
    assert props.job_queue_size == 1000
    assert props.ignored == ["number_of_netty_threads"]


def test_absent_keys_are_none_so_weirs_defaults_stay() -> None:
    props = parse_properties_text("# nothing\n", "config.properties")
    assert props.inference_address is None and props.model_store is None
    assert props.load_models is None and props.max_request_size is None
    assert props.models == {} and props.ignored == []


def test_java_separators_comments_and_blank_lines() -> None:
    text = (
        "! bang comment\n"
        "   # indented comment\n"
        "\n"
        "model_store : /a\n"
        "default_workers_per_model 3\n"
        "max_request_size\t=\t100\n"
    )
    props = parse_properties_text(text, "c")
    assert props.model_store == Path("/a")
    assert props.default_workers_per_model == 3
    assert props.max_request_size == 100
    assert props.ignored == []
    # Only the first separator is one: the value of `k==5` is `=5`.
    with pytest.raises(PropertiesError, match="'=5' is not an integer"):
        parse_properties_text("max_response_size==5\n", "c")


def test_continuation_lines_join_and_lose_their_indent() -> None:
    text = "model_store=/very/\\\n        long/\\\n  path\nload_models=a.mar,\\\n b.mar\n"
    props = parse_properties_text(text, "c")
    assert props.model_store == Path("/very/long/path")
    assert props.load_models == [StartupModel("a.mar"), StartupModel("b.mar")]


def test_an_even_run_of_backslashes_does_not_continue_the_line() -> None:
    props = parse_properties_text("model_store=C:\\\\store\\\\\nload_models=all\n", "c")
    assert props.model_store == Path("C:\\store\\")
    assert props.load_models == "all"


def test_escapes_in_keys_and_values() -> None:
    props = parse_properties_text("model\\_store=/a\\u00e9\\tb\\:c\nmy\\ key=1\n", "c")
    assert props.model_store == Path("/a\u00e9\tb:c")
    assert props.ignored == ["my key"]


def test_a_repeated_key_keeps_the_last_value() -> None:
    props = parse_properties_text("max_request_size=1\nmax_request_size=2\n", "c")
    assert props.max_request_size == 2


def test_crlf_line_ends_are_read() -> None:
    props = parse_properties_text("model_store=/a\r\nmax_request_size=7\r\n", "c")
    assert (props.model_store, props.max_request_size) == (Path("/a"), 7)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("HTTP://localhost:9000", ("localhost", 9000)),
        ("http://0.0.0.0", ("0.0.0.0", 80)),
    ],
)
def test_inference_addresses_parse_into_host_and_port(value: str, expected: Address) -> None:
    props = parse_properties_text(f"inference_address={value}\n", "c")
    assert props.inference_address == expected


def test_a_management_address_without_port_takes_torchserves_8081() -> None:
    props = parse_properties_text("management_address=http://0.0.0.0\n", "c")
    assert props.management_address == ("0.0.0.0", 8081)


def test_load_models_all_and_standalone() -> None:
    assert parse_properties_text("load_models=ALL\n", "c").load_models == "all"
    assert parse_properties_text("load_models=standalone\n", "c").load_models == []


def test_envvar_references_are_resolved_from_the_given_environment() -> None:
    props = parse_properties_text("model_store=$$STORE$$/x\n", "c", {"STORE": "/data"})
    assert props.model_store == Path("/data/x")


def test_a_missing_envvar_reference_is_an_error_naming_the_line() -> None:
    with pytest.raises(PropertiesError, match=r"^c:2: Invalid Environment Variable STORE$"):
        parse_properties_text("# x\nmodel_store=$$STORE$$\n", "c", {})


def test_ts_envvars_override_keys_only_when_enabled() -> None:
    env = {"TS_INFERENCE_ADDRESS": "http://0.0.0.0:9090", "TS_MODELS": "{}"}
    text = "inference_address=http://127.0.0.1:8080\n"
    assert parse_properties_text(text, "c", env).inference_address == ("127.0.0.1", 8080)
    enabled = parse_properties_text(text + "enable_envvars_config=true\n", "c", env)
    assert enabled.inference_address == ("0.0.0.0", 9090)
    assert enabled.enable_envvars_config is True
    assert enabled.ignored == []


def test_the_startup_timeout_is_read_from_its_key_its_variable_and_models() -> None:
    text = (
        "default_startup_timeout=300\n"
        'models={"m": {"1.0": {"responseTimeout": 5, "startupTimeout": "600"}}}\n'
    )
    props = parse_properties_text(text, "c")
    assert props.default_startup_timeout == 300
    assert props.models["m"]["1.0"] == ModelVersionSettings(
        response_timeout_s=5, startup_timeout_s=600
    )
    assert parse_properties_text("", "c").default_startup_timeout is None  # TorchServe's 120
    env = {"TS_DEFAULT_STARTUP_TIMEOUT": "900"}
    assert parse_properties_text(text, "c", env).default_startup_timeout == 300
    enabled = parse_properties_text(text + "enable_envvars_config=true\n", "c", env)
    assert enabled.default_startup_timeout == 900
    with pytest.raises(PropertiesError, match=r"^c:1: default_startup_timeout: 0 is below 1$"):
        parse_properties_text("default_startup_timeout=0\n", "c")


def test_decode_input_request_is_on_only_for_exactly_true_as_torchserves_workers_read_it() -> None:
    assert parse_properties_text("decode_input_request=true\n", "c", {}).decode_input_request
    for value in ("false", "True", "1"):
        read = parse_properties_text(f"decode_input_request={value}\n", "c", {})
        assert read.decode_input_request is False
    assert parse_properties_text("", "c", {}).decode_input_request is None  # Weir's default
    env = {"TS_DECODE_INPUT_REQUEST": "false"}
    overridden = parse_properties_text("enable_envvars_config=true\n", "c", env)
    assert overridden.decode_input_request is False


def test_allowed_urls_are_checked_as_regular_expressions() -> None:
    text = "allowed_urls=https://s3.amazonaws.com/.*,https://torchserve.pytorch.org/.*\n"
    read = parse_properties_text(text, "c", {})
    assert read.allowed_urls == "https://s3.amazonaws.com/.*,https://torchserve.pytorch.org/.*"
    with pytest.raises(PropertiesError, match=r"^c:1: allowed_urls: 'http\(s' is no regular"):
        parse_properties_text("allowed_urls=http(s\n", "c", {})


def test_a_bad_envvar_override_names_the_variable() -> None:
    env = {"TS_MAX_REQUEST_SIZE": "lots"}
    with pytest.raises(PropertiesError, match="environment variable TS_MAX_REQUEST_SIZE"):
        parse_properties_text("enable_envvars_config=True\n", "c", env)


def test_parse_properties_reads_a_file_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "config.properties"
    path.write_text("max_request_size=12\n")
    assert parse_properties(path).max_request_size == 12
    path.write_text("\n\nmax_request_size=12MB\n")
    expected = rf"^{re.escape(str(path))}:3: max_request_size: '12MB'"
    with pytest.raises(PropertiesError, match=expected):
        parse_properties(path)


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PropertiesError, match=r"nope\.properties: cannot read"):
        parse_properties(tmp_path / "nope.properties")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "inference_address=http://0.0.0.0:70000\n",
            r"c:1: inference_address: 'http://0.0.0.0:70000': port 70000 is outside 1-65535",
        ),
        ("inference_address=0.0.0.0:8080\n", r"c:1: inference_address: .* http://host:port"),
        (
            "management_address=https://0.0.0.0:8443\n",
            r"c:1: management_address: .*terminate TLS in front of Weir",
        ),
        ("metrics_address=unix:/tmp/s\n", r"c:1: metrics_address: .*unix domain sockets"),
        ("default_workers_per_model=-1\n", r"c:1: default_workers_per_model: -1 is below 0"),
        ("max_response_size=1.5\n", r"c:1: max_response_size: '1.5' is not an integer"),
        ("models={nope\n", r"c:1: models: not JSON"),
        ("models=[1]\n", r"c:1: models: must be a JSON object"),
        (
            'models={"m": {"1.0": {"batchSize": "four"}}}\n',
            r"c:1: models: m 1.0: batchSize must be an integer, not 'four'",
        ),
        (
            'models={"m": {"1.0": {"maxWorkers": 1.5}}}\n',
            r"c:1: models: m 1.0: maxWorkers must be an integer, not 1.5",
        ),
        ("load_models==a.mar\n", r"c:1: load_models: '=a.mar' is neither"),
        ("model_store=/a\\u00zz\n", r"c:1: malformed \\uxxxx escape"),
    ],
)
def test_bad_values_are_errors_naming_file_line_and_key(text: str, message: str) -> None:
    with pytest.raises(PropertiesError, match=message):
        parse_properties_text(text, "c")


def test_models_settings_accept_numbers_written_as_strings() -> None:
    props = parse_properties_text('models={"m": {"2.0": {"batchSize": "8"}}}\n', "c")
    assert props.models["m"]["2.0"].batch_size == 8
    assert props.models["m"]["2.0"].default_version is None
