"""TorchServe's ``decode_input_request``: handlers that parse their inputs themselves.

With decoding off (the worker's ``ts_decode_input_request``, which ``weir up`` takes from
``config.properties``), a handler gets every input as TorchServe's backend gives it then:
the bytes, JSON and text included. A handler may also choose for itself by setting
``TS_DECODE_INPUT_REQUEST`` as it loads, as handlers written for TorchServe do; that choice
is its archive's alone, since one Weir worker hosts many archives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.workers.test_torchserve_backend import answers, archive_of, config, ts_inputs
from weir.torchserve.envelope import Parameter, TsRequest
from workers.backends import ArchiveOptions, load_backend
from workers.backends.torchserve_backend import TorchServeBackend
from workers.backends.torchserve_loader import DECODE_ENV

DESCRIBING_HANDLER = """
    import os

    {setup}

    def describe(value):
        if isinstance(value, bytearray):
            return ["bytearray", value.decode()]
        return [type(value).__name__, value]

    def handle(data, context):
        if data is None:
            return None
        return [{{name: describe(value) for name, value in row.items()}} for row in data]
"""
REQUEST = TsRequest(
    [
        Parameter("body", "application/json", b'{"a": [1, 2]}'),
        Parameter("note", "text/plain", b"hello"),
    ]
)
DECODED = {"body": ["dict", {"a": [1, 2]}], "note": ["str", "hello"]}
RAW = {"body": ["bytearray", '{"a": [1, 2]}'], "note": ["bytearray", "hello"]}


def serve(
    tmp_path: Path, name: str, setup: str = "", options: ArchiveOptions | None = None
) -> TorchServeBackend:
    source = DESCRIBING_HANDLER.format(setup=setup)
    version_dir = tmp_path / "repository" / name / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.mar").symlink_to(archive_of(tmp_path, name, source))
    backend = load_backend(config(name), version_dir, archives=options)
    assert isinstance(backend, TorchServeBackend)
    return backend


def seen(backend: TorchServeBackend) -> object:
    (answer,) = answers(backend.infer(ts_inputs(REQUEST)))
    return json.loads(answer[0])


@pytest.fixture(autouse=True)
def no_decode_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DECODE_ENV, raising=False)


def test_inputs_are_decoded_unless_the_worker_turns_decoding_off(tmp_path: Path) -> None:
    assert seen(serve(tmp_path, "decoded")) == DECODED
    raw = serve(tmp_path, "raw", options=ArchiveOptions(decode_input_request=False))
    assert seen(raw) == RAW


def test_a_handler_that_turns_decoding_off_as_it_loads_gets_bytes_and_alone(
    tmp_path: Path,
) -> None:
    setup = f'os.environ["{DECODE_ENV}"] = "false"  # "let us do the deserialization"'
    own = serve(tmp_path, "own", setup)
    assert DECODE_ENV not in os.environ  # put back for the archives loaded after it
    other = serve(tmp_path, "other")
    assert seen(own) == RAW
    assert seen(other) == DECODED


def test_a_handler_that_turns_decoding_on_wins_over_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DECODE_ENV, "false")
    setup = f'os.environ["{DECODE_ENV}"] = "true"'
    chosen = serve(tmp_path, "chosen", setup, ArchiveOptions(decode_input_request=False))
    assert os.environ[DECODE_ENV] == "false"
    assert seen(chosen) == DECODED
