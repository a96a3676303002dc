"""Triton's logging extension: read and change the mesh's log settings while it runs.

The unit tests hold the settings' rules (Triton's names and types, its errors) and what a
process's logging does with them; the last changes them through ``tritonclient`` on a
running ``weir up`` and sees every service take the change.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ROOT, free_port, wait_until
from tests.weir_up import weir_up
from weir.errors import InvalidInput, Unsupported
from weir.log_settings import LogControl, LogSettings


def test_a_services_own_level_is_its_settings_until_the_mesh_says_otherwise() -> None:
    assert LogSettings.of_level("INFO") == LogSettings()
    assert LogSettings.of_level("debug").log_verbose_level == 1
    warning = LogSettings.of_level("WARNING")
    assert (warning.log_info, warning.log_warning, warning.log_error) == (False, True, True)


def test_a_change_takes_tritons_names_and_its_documented_ones() -> None:
    changed = LogSettings().changed(
        {"log_info": False, "log_warnings": False, "log_verbose_level": 2, "log_format": None}
    )
    assert changed == LogSettings(log_info=False, log_warning=False, log_verbose_level=2)
    assert LogSettings.decode(changed.encode(), LogSettings()) == changed
    assert LogSettings.decode({}, changed) == changed


@pytest.mark.parametrize(
    ("change", "error", "said"),
    [
        ({"log_info": "false"}, InvalidInput, "expect boolean for 'log_info'"),
        ({"log_error": 1}, InvalidInput, "expect boolean for 'log_error'"),
        ({"log_verbose_level": -1}, InvalidInput, "unsigned integer"),
        ({"log_verbose_level": True}, InvalidInput, "unsigned integer"),
        ({"log_format": "json"}, InvalidInput, "invalid argument for --log_format, got: json"),
        ({"log_file": "/tmp/x.log"}, Unsupported, "can not be updated through network protocol"),
        ({"log_level": 3}, InvalidInput, "unknown log setting 'log_level'"),
    ],
)
def test_a_bad_change_is_refused_whole(
    change: dict[str, object], error: type[Exception], said: str
) -> None:
    with pytest.raises(error, match=said):
        LogSettings().changed({"log_info": False, **change})


@pytest.fixture
def root_output() -> Iterator[io.StringIO]:
    """The root logger writing to a buffer; the root's handlers and level restored after."""
    root = logging.getLogger()
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    level, handlers = root.level, list(root.handlers)
    root.addHandler(handler)
    yield handler.stream
    root.removeHandler(handler)
    root.setLevel(level)
    for kept in handlers:
        kept.filters.clear()


def test_a_process_logs_by_the_settings_it_is_given(root_output: io.StringIO) -> None:
    control = LogControl(None, "INFO", 1.0)  # type: ignore[arg-type]  # apply needs no Redis
    log = logging.getLogger("weir.test_logging")
    control.apply(LogSettings(log_info=False, log_verbose_level=1, log_format="ISO8601"))
    log.debug("verbose")
    log.info("informative")
    log.warning("warned")
    written = root_output.getvalue()
    assert "verbose" in written and "warned" in written and "informative" not in written
    assert "T" in written.splitlines()[-1].split()[0]  # an ISO 8601 timestamp
    control.apply(LogSettings())
    log.debug("quiet again")
    assert "quiet again" not in root_output.getvalue()


def test_a_change_reaches_every_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIR_LOG_SETTINGS_REFRESH_S", "0.2")
    http_port, grpc_port = free_port(), free_port()
    args = ["--repository", str(ROOT / "examples" / "models"), "--http-port", str(http_port)]
    args += ["--grpc-port", str(grpc_port), "--metrics-port", "0", "--redis-port", str(free_port())]
    with (
        weir_up(*args, logs=True) as up,
        httpclient.InferenceServerClient(f"127.0.0.1:{http_port}") as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc,
    ):
        assert http.get_log_settings() == LogSettings().as_json()
        assert "logging" in http.get_server_metadata()["extensions"]
        changed = http.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
        assert changed["log_verbose_level"] == 1 and changed["log_format"] == "ISO8601"
        settings = grpc.get_log_settings(as_json=True)["settings"]
        assert settings["log_verbose_level"] == {"uint32_param": 1}
        assert settings["log_info"] == {"bool_param": True}

        def took_it(service: str) -> bool:
            said = f" {service} INFO weir.log_settings: log settings now"
            return any(said in line for line in up.lines)

        wait_until(lambda: all(map(took_it, ("worker", "batcher"))), 10, "every service to follow")
        grpc.update_log_settings({"log_verbose_level": 0})
        assert http.get_log_settings()["log_verbose_level"] == 0
        with pytest.raises(httpclient.InferenceServerException, match="expect boolean"):
            http.update_log_settings({"log_info": "yes"})
        with pytest.raises(grpcclient.InferenceServerException, match="can not be updated"):
            grpc.update_log_settings({"log_file": "/tmp/elsewhere.log"})
