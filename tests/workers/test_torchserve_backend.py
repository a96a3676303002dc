"""The torchserve backend runs a TorchServe archive's handler unchanged, batch by batch.

Every archive here is built by the real ``torch-model-archiver``; the handlers are the kind
TorchServe users write (a function, a class, a ``BaseHandler`` subclass, a built-in name).
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.torchserve.archives import build_archive
from weir.config import ModelConfig
from weir.errors import (
    ConfigError,
    ErrorKind,
    InvalidInput,
    NotFound,
    ServerError,
    Unavailable,
    WeirError,
)
from weir.tensors import Tensor
from weir.torchserve import envelope
from weir.torchserve.archive import read_manifest
from weir.torchserve.envelope import Parameter, TsRequest
from weir.wire import InferRequest
from workers.backends import load_backend
from workers.backends.torchserve_backend import TorchServeBackend
from workers.execution import BatchRunner

# Importing TorchServe's `ts` package warns twice, neither about Weir: ts/version.py leaves
# version.txt open (a ResourceWarning), and ts.torch_handler.base_handler imports
# openvino.torch, whose torchdynamo backend probes torch's deprecated
# `inline_inbuilt_nn_modules` option (a FutureWarning from torch 2.13). Only the tests that
# import `ts` take these filters; whichever runs first sees the warnings.
IMPORTS_TS = [
    pytest.mark.filterwarnings(
        r"ignore:unclosed file <_io\.TextIOWrapper name='[^']*ts/version\.txt':ResourceWarning"
    ),
    pytest.mark.filterwarnings(
        r"ignore:torch\._dynamo\.config\.inline_inbuilt_nn_modules is deprecated:FutureWarning"
    ),
]


def imports_ts(test: Any) -> Any:
    for mark in IMPORTS_TS:
        test = mark(test)
    return test


def config(name: str, max_batch_size: int = 4) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": name,
            "backend": "torchserve",
            "max_batch_size": max_batch_size,
            "input": envelope.INPUTS,
            "output": envelope.OUTPUTS,
        }
    )


def serve(tmp_path: Path, archive: Path, name: str, max_batch_size: int = 4) -> TorchServeBackend:
    """Load ``archive`` as version 1 of ``name``, linked as model.mar as the model store does."""
    version_dir = tmp_path / "repository" / name / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.mar").symlink_to(archive)
    backend = load_backend(config(name, max_batch_size), version_dir)
    assert isinstance(backend, TorchServeBackend)
    return backend


def archive_of(tmp_path: Path, name: str, source: str, **options: Any) -> Path:
    return build_archive(tmp_path / "store", name, textwrap.dedent(source), **options)


def objects(items: list[bytes], batched: bool = True) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(-1, 1) if batched else array


def ts_inputs(*requests: TsRequest) -> dict[str, np.ndarray]:
    return {envelope.TS_REQUEST: objects([envelope.pack_request(r) for r in requests])}


def json_request(value: Any, **headers: str) -> TsRequest:
    return TsRequest([Parameter("data", "application/json", json.dumps(value).encode())], headers)


def answers(outputs: dict[str, np.ndarray]) -> list[tuple[bytes, int, dict[str, str]]]:
    bodies = outputs[envelope.RESPONSE].reshape(-1).tolist()
    codes = outputs[envelope.STATUS].reshape(-1).tolist()
    headers = [envelope.unpack_headers(h) for h in outputs[envelope.HEADERS].reshape(-1)]
    return list(zip(bodies, codes, headers, strict=True))


def as_json(value: Any) -> bytes:
    """An answer as TorchServe serializes a non-bytes, non-str result."""
    return json.dumps(value, indent=2).encode()


FUNCTION_HANDLER = """
    seen = {}

    def handle(data, context):
        if data is None:  # TorchServe initializes a function entry point with handle(None, ctx)
            seen["initialized"] = context.system_properties["model_dir"]
            return None
        return [
            {
                "body": row["body"].decode(),
                "type": type(row["body"]).__name__,
                "batch": len(data),
                "initialized": "initialized" in seen,
                "request_id": bool(context.get_request_id(index)),
            }
            for index, row in enumerate(data)
        ]
"""


@pytest.mark.parametrize("max_batch_size", [4, 0])
def test_function_entry_point_is_initialized_then_gets_the_batch_of_raw_bodies(
    tmp_path: Path, max_batch_size: int
) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "fn", FUNCTION_HANDLER), "fn", max_batch_size)
    bodies = [b"one", b"two", b"three"] if max_batch_size else [b"one"]
    outputs = backend.infer({envelope.BODY: objects(bodies, batched=max_batch_size > 0)})

    shape = (len(bodies), 1) if max_batch_size else (1,)
    assert {name: array.shape for name, array in outputs.items()} == dict.fromkeys(
        (envelope.RESPONSE, envelope.STATUS, envelope.HEADERS), shape
    )
    assert outputs[envelope.STATUS].dtype == np.int32
    expected = [
        {
            "body": body.decode(),
            "type": "bytearray",
            "batch": len(bodies),
            "initialized": True,
            "request_id": True,
        }
        for body in bodies
    ]
    assert answers(outputs) == [
        (as_json(e), 200, {"content-type": "application/json"}) for e in expected
    ]


@pytest.mark.parametrize("archive_format", ["zip-store", "tgz", "no-archive"])
def test_every_archive_format_serves(tmp_path: Path, archive_format: str) -> None:
    archive = archive_of(tmp_path, "formats", FUNCTION_HANDLER, archive_format=archive_format)
    backend = serve(tmp_path, archive, "formats")

    (answer,) = answers(backend.infer({envelope.BODY: objects([b"hi"])}))
    assert json.loads(answer[0])["body"] == "hi"


def test_manifest_function_name_picks_that_function(tmp_path: Path) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "entry.py").write_text(
        textwrap.dedent(
            """
            def handle(data, context):
                return ["the default function" for _ in data or []]

            def predict(data, context):
                return ["predict" for _ in data or []]
            """
        )
    )
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    command = [str(archiver), "--model-name", "named", "--version", "1.0"]
    command += ["--handler", "entry:predict", "--export-path", str(tmp_path)]
    subprocess.run(command, cwd=sources, check=True, env=os.environ | {"TMPDIR": str(tmp_path)})
    assert read_manifest(tmp_path / "named.mar").handler == "entry:predict"

    backend = serve(tmp_path, tmp_path / "named.mar", "named")
    assert answers(backend.infer({envelope.BODY: objects([b"x"])})) == [(b"predict", 200, {})]


CLASS_HANDLER = """
    from collections import OrderedDict  # an imported class is not the handler class


    class Describer:
        def __init__(self):
            self.initialized = False

        def initialize(self, context):
            self.properties = dict(context.system_properties)
            self.name = context.model_name
            self.manifest_name = context.manifest["model"]["modelName"]
            self.yaml = context.model_yaml_config
            self.initialized = True

        def handle(self, data, context):
            facts = OrderedDict(
                name=self.name,
                manifest_name=self.manifest_name,
                server=self.properties["server_name"],
                gpu_id=self.properties["gpu_id"],
                batch_size=self.properties["batch_size"],
                limit_max_image_pixels=self.properties["limit_max_image_pixels"],
                threshold=self.yaml["handler"]["threshold"],
            )
            return [" ".join(f"{k}={v}" for k, v in facts.items()) for _ in data]
"""


def test_class_handler_is_built_and_initialized_with_the_context(tmp_path: Path) -> None:
    archive = archive_of(
        tmp_path, "describer", CLASS_HANDLER, config_yaml="handler:\n  threshold: 0.25\n"
    )
    backend = serve(tmp_path, archive, "served_name", max_batch_size=8)

    (answer,) = answers(backend.infer({envelope.BODY: objects([b""])}))
    assert answer == (
        b"name=served_name manifest_name=describer server=Weir gpu_id=None batch_size=8 "
        b"limit_max_image_pixels=True threshold=0.25",
        200,
        {},  # a str answer carries no content type unless the handler sets one
    )
    assert Path(backend.context.system_properties["model_dir"], "handler.py").is_file()


def test_the_context_gives_the_instances_cuda_device_as_gpu_id(tmp_path: Path) -> None:
    archive = archive_of(
        tmp_path, "describer", CLASS_HANDLER, config_yaml="handler:\n  threshold: 0.25\n"
    )
    version_dir = tmp_path / "repository" / "describer" / "1"
    version_dir.mkdir(parents=True)
    (version_dir / "model.mar").symlink_to(archive)
    backend = TorchServeBackend(config("describer", 8), version_dir, device=1)

    assert backend.context.system_properties["gpu_id"] == 1
    (answer,) = answers(backend.infer({envelope.BODY: objects([b""])}))
    assert b" gpu_id=1 " in answer[0]


EXTRA_FILES_HANDLER = """
    import json
    import os

    from labels import shout  # a sibling module shipped with --extra-files


    class Labeller:
        def initialize(self, context):
            model_dir = context.system_properties["model_dir"]
            with open(os.path.join(model_dir, "index_to_name.json")) as file:
                self.names = json.load(file)

        def handle(self, data, context):
            return [shout(self.names[str(row["data"])]) for row in data]
"""


def test_initialize_reads_extra_files_and_imports_sibling_modules(tmp_path: Path) -> None:
    extras: dict[str, str | bytes] = {
        "index_to_name.json": json.dumps({"0": "cat", "1": "dog"}),
        "labels.py": "def shout(text):\n    return text.upper() + '!'\n",
    }
    archive = archive_of(tmp_path, "labeller", EXTRA_FILES_HANDLER, extra_files=extras)
    backend = serve(tmp_path, archive, "labeller")

    outputs = backend.infer(ts_inputs(json_request(1), json_request(0)))
    assert [body for body, _, _ in answers(outputs)] == [b"DOG!", b"CAT!"]
    assert "labels" not in sys.modules  # the archive's modules leave the process's namespace


SHADOWED_HANDLER = """
    import json  # the process's json: the archive's json.py cannot replace it

    def handle(data, context):
        return [str(hasattr(json, "FROM_THE_ARCHIVE")) for _ in data or []]
"""


def test_a_module_already_imported_wins_over_the_archives_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    extras: dict[str, str | bytes] = {"json.py": "FROM_THE_ARCHIVE = True\n"}
    archive = archive_of(tmp_path, "shadowed", SHADOWED_HANDLER, extra_files=extras)
    backend = serve(tmp_path, archive, "shadowed")

    assert answers(backend.infer({envelope.BODY: objects([b""])}))[0][0] == b"False"
    assert "the archive's json.py is not imported: module json is already loaded" in caplog.text


def two_archives_handler(answer: str) -> str:
    return f"""
        from utils import ANSWER

        def handle(data, context):
            return [ANSWER + "/" + {answer!r} for _ in data or []]
    """


def test_two_archives_shipping_the_same_module_names_stay_separate(tmp_path: Path) -> None:
    first = archive_of(
        tmp_path, "first", two_archives_handler("a"), extra_files={"utils.py": "ANSWER = 'A'"}
    )
    second = archive_of(
        tmp_path, "second", two_archives_handler("b"), extra_files={"utils.py": "ANSWER = 'B'"}
    )
    backend_a = serve(tmp_path, first, "first")
    backend_b = serve(tmp_path, second, "second")

    body = {envelope.BODY: objects([b""])}
    assert answers(backend_a.infer(body))[0][0] == b"A/a"
    assert answers(backend_b.infer(body))[0][0] == b"B/b"
    assert "utils" not in sys.modules and "handler" not in sys.modules


DECODING_HANDLER = """
    def describe(value):
        if isinstance(value, bytearray):
            return ["bytearray", value.hex()]
        return [type(value).__name__, value]

    def handle(data, context):
        if data is None:
            return None
        return [
            {
                "inputs": {name: describe(value) for name, value in row.items()},
                "headers": context.get_all_request_header(index),
                "trace": context.get_request_header(index, "X-Trace"),
            }
            for index, row in enumerate(data)
        ]
"""


def test_parameters_are_decoded_by_content_type_as_torchserve_does(tmp_path: Path) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "decoder", DECODING_HANDLER), "decoder")
    parameters = [
        Parameter("json", "application/json", b'{"a": [1, 2]}'),
        Parameter("text", "text/plain", "h\u00e9llo".encode()),
        Parameter("csv", "text/csv", b"a,b"),
        Parameter("blob", "application/octet-stream", b"\x00\xff"),
        Parameter("broken_json", "application/json", b"{not json"),
        Parameter("broken_text", "text/plain", b"\xff\xfe"),
        Parameter("json_with_charset", "application/json; charset=utf-8", b"[1]"),
        # Past orjson (an integer over 64 bits): parsed still, as Python's json parses it.
        Parameter("big_json", "application/json", b"[18446744073709551616, 1.5]"),
    ]
    request = TsRequest(parameters, {"x-trace": "abc", "explain": "True"})

    (answer,) = answers(backend.infer(ts_inputs(request)))
    assert json.loads(answer[0]) == {
        "inputs": {
            "json": ["dict", {"a": [1, 2]}],
            "text": ["str", "h\u00e9llo"],
            "csv": ["str", "a,b"],
            "blob": ["bytearray", "00ff"],
            "broken_json": ["bytearray", b"{not json".hex()],
            "broken_text": ["bytearray", "fffe"],
            # TorchServe parses exactly application/json; anything else stays bytes
            "json_with_charset": ["bytearray", b"[1]".hex()],
            "big_json": ["list", [18446744073709551616, 1.5]],
        },
        "headers": {p.name: {"content-type": p.content_type} for p in parameters}
        | {"x-trace": "abc", "explain": "True"},
        "trace": "abc",  # found whatever the case, unlike TorchServe's exact lookup
    }


STATUS_HANDLER = """
    import torch

    def handle(data, context):
        if data is None:
            return None
        context.set_response_status(201, "Created", idx=0)
        context.set_response_content_type(0, "text/csv")
        context.set_response_status(code=404, phrase="Gone", idx=1)
        context.set_response_header(2, "X-Model", context.model_name)
        return ["a,b", {"missing": True}, b"\\x00raw", torch.tensor([1.5, 2.0])]
"""


def test_status_and_headers_set_per_request_come_out_with_each_answer(tmp_path: Path) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "status", STATUS_HANDLER), "status")

    outputs = backend.infer({envelope.BODY: objects([b"1", b"2", b"3", b"4"])})
    *plain, (tensor, tensor_status, tensor_headers) = answers(outputs)
    assert plain == [
        (b"a,b", 201, {"content-type": "text/csv"}),
        (as_json({"missing": True}), 404, {"content-type": "application/json"}),
        (b"\x00raw", 200, {"X-Model": "status"}),
    ]
    assert outputs[envelope.STATUS].tolist() == [[201], [404], [200], [200]]
    # a tensor answer is torch.save's bytes, as TorchServe sends it
    assert torch.load(io.BytesIO(tensor)).tolist() == [1.5, 2.0]
    assert (tensor_status, tensor_headers) == (200, {})


RESULT_HANDLER = """
    def handle(data, context):
        if data is None:
            return None
        kind = bytes(data[0]["body"]).decode()
        if kind == "short":
            return ["only one"] * (len(data) - 1)
        if kind == "dict":
            return {"not": "a list"}
        if kind == "object":
            return [object() for _ in data]
        return ["ok"] * len(data)
"""


@pytest.mark.parametrize(
    ("kind", "error", "words"),
    [
        (
            "short",
            ServerError,
            "model 'results': number of batch response mismatched, expect: 3, got: 2",
        ),
        (
            "dict",
            ServerError,
            "model 'results': Invalid model predict output: handle returned "
            "dict, expected a list of 3",
        ),
        ("object", Unavailable, "model 'results': Unsupported model output data type: object"),
    ],
)
def test_a_batch_answer_that_is_not_one_serializable_result_per_request_fails(
    tmp_path: Path, kind: str, error: type[WeirError], words: str
) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "results", RESULT_HANDLER), "results")

    with pytest.raises(error) as caught:
        backend.infer({envelope.BODY: objects([kind.encode(), b"x", b"y"])})
    assert type(caught.value) is error
    assert caught.value.message == words


RAISING_HANDLER = """
    from ts.utils.util import PredictionException

    def handle(data, context):
        if data is None:
            return None
        code = int(bytes(data[0]["body"]))
        if code == 0:
            raise KeyError("no such token")
        if code == 1:
            raise MemoryError()
        raise PredictionException(f"refused with {code}", code)
"""


@imports_ts
@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b"400", InvalidInput, "refused with 400"),
        (b"404", NotFound, "refused with 404"),
        (b"503", Unavailable, "refused with 503"),
        (b"507", ServerError, "refused with 507"),
        (b"0", Unavailable, "model 'raiser': Prediction failed: KeyError: 'no such token'"),
        (b"1", ServerError, "model 'raiser': Out of resources: MemoryError: "),
    ],
)
def test_handler_exceptions_keep_torchserves_meaning(
    tmp_path: Path, body: bytes, error: type[WeirError], message: str
) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "raiser", RAISING_HANDLER), "raiser")

    with pytest.raises(error) as caught:
        backend.infer({envelope.BODY: objects([body])})
    assert type(caught.value) is error
    assert caught.value.message == message


PICKY_HANDLER = """
    def handle(data, context):
        if data is None:
            return None
        if any(row["data"] < 0 for row in data):
            raise ValueError("negative input")
        return [row["data"] * 2 for row in data]
"""


def test_in_the_batch_runner_a_failing_request_fails_alone(tmp_path: Path) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "picky", PICKY_HANDLER), "picky")
    runner = BatchRunner(backend.config, backend)
    requests = [
        InferRequest(f"r{value}", "picky", "1", ts_tensors(json_request(value)), "reply", 0)
        for value in (1, -1, 3)
    ]

    replies, batch_sizes = runner.run(requests)
    assert batch_sizes[0] == 3  # one handle call for the whole batch first
    good, bad, also_good = replies
    assert good.outputs[envelope.RESPONSE].to_numpy().tolist() == [[b"2"]]
    assert also_good.outputs[envelope.RESPONSE].to_numpy().tolist() == [[b"6"]]
    assert also_good.outputs[envelope.STATUS].to_numpy().tolist() == [[200]]
    assert bad.error == (
        ErrorKind.UNAVAILABLE,
        "model 'picky': Prediction failed: ValueError: negative input",
    )


def ts_tensors(request: TsRequest) -> dict[str, Tensor]:
    return {envelope.TS_REQUEST: Tensor.from_numpy(ts_inputs(request)[envelope.TS_REQUEST])}


FAILING_INIT_HANDLER = """
    class Broken:
        def initialize(self, context):
            raise RuntimeError("weights.bin is missing")

        def handle(self, data, context):
            return data
"""


def test_initialize_failing_is_a_config_error_naming_archive_handler_and_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = archive_of(tmp_path, "broken", FAILING_INIT_HANDLER)

    with pytest.raises(ConfigError) as caught:
        serve(tmp_path, archive, "broken")
    message = str(caught.value)
    assert "model 'broken'" in message and "'handler.py'" in message
    assert str(tmp_path / "repository" / "broken" / "1" / "model.mar") in message
    assert "initialize failed: RuntimeError: weights.bin is missing" in message
    assert "Traceback" in caplog.text  # the whole story goes to the log


def test_requirements_are_not_installed_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    archive = archive_of(tmp_path, "needy", FUNCTION_HANDLER, requirements="numpy\n")
    caplog.set_level(logging.INFO, "workers.backends.torchserve_loader")

    serve(tmp_path, archive, "needy")
    assert "does not install the archive's requirements.txt" in caplog.text


METRICS_HANDLER = """
    def handle(data, context):
        metrics = context.metrics
        if data is None:
            metrics.add_metric_to_cache("Loaded", "count", ["ModelName"])
            return None
        metrics.add_counter("Requests", len(data))
        metrics.add_time("Work", 12.5, None, "ms")
        metrics.add_size("Memory", 3, idx=0, unit="GB")
        metrics.add_percent("Share", 50.0)
        metrics.add_error("Oops", 1)
        metrics.add_metric("Custom", 7, "widgets", None, [])
        metrics.get_metric("Loaded").add_or_update(1, [context.model_name])
        metrics.get_metric("Undeclared", "gauge").update(2)
        return ["ok"] * len(data)
"""


def test_handler_metrics_are_recorded_in_memory(tmp_path: Path) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "metered", METRICS_HANDLER), "metered")
    backend.infer({envelope.BODY: objects([b"", b""])})

    last = {
        key: next(iter(metric.values.values()))
        for key, metric in backend.context.metrics.cache.items()
    }
    assert last == {
        ("counter", "Loaded"): 1,
        ("counter", "Requests"): 2,
        ("gauge", "Work"): 12.5,
        ("gauge", "Memory"): 3,
        ("gauge", "Share"): 50.0,
        ("counter", "Oops"): 1,
        ("counter", "Custom"): 7,
        ("gauge", "Undeclared"): 2,
        ("gauge", "PredictionTime"): last[("gauge", "PredictionTime")],
    }
    assert backend.context.metrics.cache[("counter", "Loaded")].values == {("metered",): 1}


BASE_HANDLER = """
    import torch
    from ts.torch_handler.base_handler import BaseHandler


    class Scorer(BaseHandler):
        def preprocess(self, data):
            rows = [row.get("data") or row.get("body") for row in data]
            return torch.tensor(rows, dtype=torch.float32)

        def postprocess(self, data):
            rows = data.tolist()
            return [{"scores": row, "best": max(range(3), key=row.__getitem__)} for row in rows]
"""


@imports_ts
# TorchServe's MetricsCacheYamlImpl, used for the in-process run, leaves its YAML file open.
@pytest.mark.filterwarnings(
    r"ignore:unclosed file <_io\.TextIOWrapper name='[^']*ts/configs/metrics\.yaml':ResourceWarning"
)
def test_base_handler_subclass_answers_as_it_does_in_torchserve(tmp_path: Path) -> None:
    torch.manual_seed(7)
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(-1)))
    weights = tmp_path / "model.pt"
    torch.jit.save(model, str(weights))
    archive = archive_of(tmp_path, "scorer", BASE_HANDLER, serialized_file=weights)
    backend = serve(tmp_path, archive, "scorer")
    rows = [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0], [-3.0, 0.25, 0.0, 9.0]]

    outputs = backend.infer(ts_inputs(*(json_request(row) for row in rows)))
    expected = run_in_torchserve(tmp_path, backend, [{"data": row} for row in rows])
    assert answers(outputs) == [
        (as_json(value), 200, {"content-type": "application/json"}) for value in expected
    ]
    assert ("gauge", "HandlerTime") in backend.context.metrics.cache


def run_in_torchserve(tmp_path: Path, backend: TorchServeBackend, data: list[Any]) -> list[Any]:
    """The same handler run in-process with TorchServe's own Context, metrics and requests."""
    import ts
    from ts.context import Context, RequestProcessor
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    source = tmp_path / "in_process" / "scorer_handler.py"
    source.parent.mkdir()
    source.write_text(textwrap.dedent(BASE_HANDLER))
    spec = importlib.util.spec_from_file_location("scorer_in_process", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    metrics = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    manifest = read_manifest(backend.model_dir).raw
    context = Context("scorer", str(backend.model_dir), manifest, 4, None, ts.__version__)
    context.metrics = metrics
    context.model_yaml_config = {}
    handler = module.Scorer()
    handler.initialize(context)
    context.request_ids = {index: f"r{index}" for index in range(len(data))}
    context.request_processor = [RequestProcessor({}) for _ in data]
    result: list[Any] = handler.handle(data, context)
    return result


@imports_ts
def test_built_in_handler_with_a_missing_library_names_the_package(tmp_path: Path) -> None:
    assert importlib.util.find_spec("torchvision") is None  # image_classifier needs it
    archive = build_archive(tmp_path / "store", "vision", handler_file="image_classifier")
    assert read_manifest(archive).handler == "image_classifier"

    with pytest.raises(ConfigError) as caught:
        serve(tmp_path, archive, "vision")
    message = str(caught.value)
    assert "model 'vision': handler 'image_classifier' (built-in)" in message
    assert "needs the package 'torchvision', which is not installed: pip install torchvision" in (
        message
    )


@imports_ts
def test_a_handler_name_neither_in_the_archive_nor_built_in_is_a_config_error(
    tmp_path: Path,
) -> None:
    # The archiver refuses such a name, so this edits the manifest of a no-archive build.
    archive = build_archive(tmp_path / "store", "nameless", archive_format="no-archive")
    manifest_file = archive / "MAR-INF" / "MANIFEST.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["model"]["handler"] = "no_such_handler"
    manifest_file.write_text(json.dumps(manifest))

    with pytest.raises(ConfigError, match=r"neither a file of .* nor a TorchServe built-in"):
        serve(tmp_path, archive, "nameless")


def test_handler_needing_ts_without_ts_installed_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python's own way to make a package unimportable: None in sys.modules for it.
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")] + ["ts"]:
        monkeypatch.setitem(sys.modules, name, None)
    archive = archive_of(tmp_path, "subclass", BASE_HANDLER)

    with pytest.raises(ConfigError) as caught:
        serve(tmp_path, archive, "subclass")
    assert str(caught.value).startswith(
        "model 'subclass': handler 'handler.py' needs TorchServe's 'ts' package: "
        "pip install 'weir[torchserve]' (missing module 'ts"
    )


def test_a_request_with_neither_input_is_invalid(tmp_path: Path) -> None:
    backend = serve(tmp_path, archive_of(tmp_path, "empty", FUNCTION_HANDLER), "empty")

    with pytest.raises(InvalidInput, match="needs the input body or ts_request"):
        backend.infer({})
    with pytest.raises(InvalidInput, match="malformed ts_request"):
        backend.infer({envelope.TS_REQUEST: objects([b"\x01garbage"])})


@imports_ts
def test_the_base_handler_builtin_loads_the_archives_torchscript_model(tmp_path: Path) -> None:
    model = torch.jit.script(torch.nn.Linear(2, 2))
    model.save(str(tmp_path / "linear.pt"))
    archive = build_archive(
        tmp_path / "store",
        "plain",
        handler_file="base_handler",
        serialized_file=tmp_path / "linear.pt",
    )
    backend = serve(tmp_path, archive, "plain")
    handler = backend.entry_point.handle.__self__  # type: ignore[attr-defined]
    assert type(handler).__module__ == "ts.torch_handler.base_handler"
    assert isinstance(handler.model, torch.jit.ScriptModule)
    # BaseHandler's own preprocess takes tensors, not TorchServe's request dicts: as in
    # TorchServe, a request it cannot read fails with "Prediction failed" (503).
    with pytest.raises(Unavailable, match="model 'plain': Prediction failed"):
        backend.infer(ts_inputs(json_request([1.0, 2.0])))
