"""Triton's trace extension: sampled requests' timestamps written as Triton's trace JSON.

The unit tests hold the settings' rules and the file's shape; the last traces a running
``weir up`` and changes its settings through ``tritonclient``, HTTP and gRPC.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway.tracing import Tracer, TraceSettings
from tests.conftest import ROOT, free_port
from tests.weir_up import weir_up
from weir.errors import ConfigError, InvalidInput, Unsupported
from weir.stats import Stamp
from weir.tensors import Tensor
from weir.trace_settings import trace_options

STAMPS = {
    Stamp.GATEWAY_IN: 100,
    Stamp.COMPUTE_START: 200,
    Stamp.COMPUTE_INPUT_END: 300,
    Stamp.COMPUTE_INFER_END: 400,
    Stamp.COMPUTE_END: 500,
    Stamp.GATEWAY_OUT: 600,
}
NAMES = [
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
]


def test_settings_take_tritons_values() -> None:
    changed = TraceSettings().changed(
        {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "10", "trace_count": ["5"]}
    )
    assert changed.as_json() == {
        "trace_file": "",
        "trace_level": ["TIMESTAMPS", "TENSORS"],
        "trace_rate": "10",
        "trace_count": "5",
        "log_frequency": "0",
    }
    for bad in ({"trace_level": ["LOUD"]}, {"trace_rate": "0"}, {"trace_count": "-2"}, {"x": 1}):
        with pytest.raises(InvalidInput):
            TraceSettings().changed(bad)
    with pytest.raises(Unsupported, match="can not be updated"):
        TraceSettings().changed({"trace_file": "/etc/passwd"})


def test_tritons_trace_config_flags() -> None:
    flags = ["triton,file=/tmp/t.json", "level=TIMESTAMPS", "rate=5", "mode=triton"]
    options = trace_options(flags)
    assert options == {"trace_file": "/tmp/t.json", "trace_level": "TIMESTAMPS", "trace_rate": "5"}
    with pytest.raises(ConfigError, match="only mode=triton"):
        trace_options(["mode=opentelemetry"])
    with pytest.raises(ConfigError, match="unknown key"):
        trace_options(["triton,colour=red"])


def tracer(path: Path, **settings: object) -> Tracer:
    base = TraceSettings(str(path), ("TIMESTAMPS",)).changed(settings)
    return Tracer(None, base, 1, 1.0)  # type: ignore[arg-type]  # sampling needs no Redis


def test_one_request_in_each_rate_is_traced_up_to_the_count(tmp_path: Path) -> None:
    traces = tracer(tmp_path / "t.json", trace_rate="3", trace_count="2")
    assert [traces.sample("m") for _ in range(9)] == [False, False, True] * 2 + [False] * 3
    assert tracer(tmp_path / "t.json", trace_level=["OFF"]).sample("m") is False


def test_traces_are_tritons_json_written_at_the_end(tmp_path: Path) -> None:
    traces = tracer(tmp_path / "t.json", trace_level=["TIMESTAMPS", "TENSORS"])
    given = {"IN": Tensor.from_numpy(np.arange(3, dtype=np.int32).reshape(1, 3))}
    traces.record("m", "2", "req-1", STAMPS, (given, {}))
    assert not (tmp_path / "t.json").exists()
    traces.close()
    written = json.loads((tmp_path / "t.json").read_text())
    assert written[0] == {"id": 1, "model_name": "m", "model_version": 2}
    assert written[1]["request_id"] == "req-1"
    assert [t["name"] for t in written[1]["timestamps"]] == NAMES
    assert written[2] == {
        "id": 1,
        "activity": "TENSOR_QUEUE_INPUT",
        "tensor": {"name": "IN", "data": "0,1,2", "shape": "1,3", "dtype": "INT32"},
    }


def test_log_frequency_writes_numbered_files(tmp_path: Path) -> None:
    traces = tracer(tmp_path / "t.json", log_frequency="2")
    for _ in range(5):
        traces.record("m", "1", None, STAMPS)
    traces.close()
    counts = [len(json.loads((tmp_path / f"t.json.{i}").read_text())) for i in range(3)]
    assert counts == [4, 4, 2]  # two entries per trace


def test_a_running_mesh_traces_and_takes_new_settings(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples" / "models" / "tiny_mlp", tmp_path / "models" / "tiny_mlp")
    trace_file = tmp_path / "trace.json"
    http_port, grpc_port = free_port(), free_port()
    args = ["--repository", str(tmp_path / "models"), "--http-port", str(http_port)]
    args += ["--grpc-port", str(grpc_port), "--metrics-port", "0", "--redis-port", str(free_port())]
    args += ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS"]
    args += ["--trace-config", "rate=1"]
    tensor = httpclient.InferInput("INPUT0", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    with (
        weir_up(*args),
        httpclient.InferenceServerClient(f"127.0.0.1:{http_port}") as http,
        grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as grpc,
    ):
        assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
        assert "trace" in http.get_server_metadata()["extensions"]
        for number in range(3):
            http.infer("tiny_mlp", [tensor], request_id=f"r{number}")
        grpc.update_trace_settings("tiny_mlp", {"trace_rate": "2", "trace_count": "1"})
        model = http.get_trace_settings("tiny_mlp")
        assert (model["trace_rate"], model["trace_count"]) == ("2", "1")
        assert http.get_trace_settings()["trace_rate"] == "1"  # the global ones are kept
        for number in range(3, 9):
            http.infer("tiny_mlp", [tensor], request_id=f"r{number}")
        http.update_trace_settings("tiny_mlp", {})  # the model's own are removed
        assert http.get_trace_settings("tiny_mlp")["trace_rate"] == "1"
        grpc_settings = grpc.get_trace_settings(as_json=True)["settings"]
        assert grpc_settings["trace_level"] == {"value": ["TIMESTAMPS"]}
        with pytest.raises(httpclient.InferenceServerException, match="can not be updated"):
            http.update_trace_settings(settings={"trace_file": str(tmp_path / "elsewhere")})
        with pytest.raises(grpcclient.InferenceServerException, match="trace_level"):
            grpc.update_trace_settings(settings={"trace_level": ["LOUD"]})
    written = json.loads(trace_file.read_text())
    requests = [entry["request_id"] for entry in written if "timestamps" in entry]
    assert requests == ["r0", "r1", "r2", "r4"]  # then one in two, once
    stamps = next(entry["timestamps"] for entry in written if "timestamps" in entry)
    assert [stamp["name"] for stamp in stamps] == NAMES
    times = [stamp["ns"] for stamp in stamps]
    assert times == sorted(times)
