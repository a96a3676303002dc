"""Triton's model control in mode explicit, through ``tritonclient`` unmodified (HTTP and gRPC).

One mesh for the module, on its own redis-server, in mode explicit with ``tiny_mlp`` loaded
at start and a management token, over a private copy of a few example models, the MiniLM
pipeline and two models written here to fail: one whose ``initialize`` raises, one whose
config names an unknown data type. Each test runs once per protocol and leaves what it
loaded as it found it, so the tests do not depend on each other's order (but the first
one, which reads the index as the mesh started). The last tests check that modes none
(the session mesh) and poll refuse loads and unloads as Triton does.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.chaos.helpers import private_repository
from tests.conftest import EXAMPLES, Mesh, private_mesh

MANAGEMENT_TOKEN = "control-secret"
PIPELINE = "minilm_embed"
STEPS = ("minilm_encoder", "minilm_pool", "minilm_tokenizer")
COPIED = ["tiny_mlp", "wide_mlp", "tiny_mlp_onnx", PIPELINE, *STEPS]
NOT_ALLOWED = "explicit model load / unload is not allowed if polling is enabled"
# Nothing is in flight when a module's mesh stops: its services need not wait 10 s for it.
SHORT_DRAIN = {"WEIR_SHUTDOWN_GRACE_S": "2"}
GRPC_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    503: grpc.StatusCode.UNAVAILABLE,
}
BROKEN_CONFIG = """
    backend: python
    max_batch_size: 4
    input: [{name: X, data_type: TYPE_FP32, dims: [2]}]
    output: [{name: Y, data_type: TYPE_FP32, dims: [2]}]
"""
BROKEN_HANDLER = """
    class Broken:
        def initialize(self, context):
            raise RuntimeError("its weights are missing on purpose")

        def inference(self, batch):
            return {"Y": batch["X"]}
"""
BAD_CONFIG = """
    backend: python
    max_batch_size: 4
    input: [{name: X, data_type: TYPE_FLOAT, dims: [2]}]
    output: [{name: Y, data_type: TYPE_FP32, dims: [2]}]
"""
# tiny_mlp_onnx's config.pbtxt as JSON, with a smaller batch and two instances.
ONNX_OVERRIDE = {
    "name": "tiny_mlp_onnx",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [64]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}],
    "instance_group": [{"kind": "KIND_CPU", "count": 2}],
}


def write_model(root: Path, name: str, config: str, handler: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(handler))


@pytest.fixture(scope="module")
def control_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    repository = private_repository(EXAMPLES, tmp_path_factory.mktemp("control") / "m", COPIED)
    write_model(repository, "broken_init", BROKEN_CONFIG, BROKEN_HANDLER)
    write_model(repository, "bad_config", BAD_CONFIG, BROKEN_HANDLER)
    env = {
        "WEIR_MODEL_CONTROL_MODE": "explicit",
        "WEIR_LOAD_MODEL": "tiny_mlp",
        "WEIR_GATEWAY_MANAGEMENT_TOKEN": MANAGEMENT_TOKEN,
        **SHORT_DRAIN,
    }
    with private_mesh(repository, env) as running:
        yield running


@pytest.fixture(scope="module")
def poll_mesh(build_models: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    repository = tmp_path_factory.mktemp("poll") / "models"
    build_models.build_model(repository, "tiny_mlp")
    with private_mesh(repository, {"WEIR_MODEL_CONTROL_MODE": "poll", **SHORT_DRAIN}) as running:
        yield running


class Triton:
    """One of tritonclient's clients on a mesh, each call with the management token if any.

    Answers come back in one shape for both protocols; ``refused`` checks an error's status
    as the protocol spells it (HTTP 404, gRPC NOT_FOUND).
    """

    def __init__(self, protocol: str, mesh: Mesh, token: str | None) -> None:
        self.protocol = protocol
        self.module: Any = httpclient if protocol == "http" else grpcclient
        target = mesh.url.removeprefix("http://") if protocol == "http" else mesh.grpc_target
        self.client = self.module.InferenceServerClient(target)
        self.headers = {"authorization": f"Bearer {token}"} if token else None

    def index(self) -> dict[str, dict[str, str]]:
        """The repository index by model name: version, state and reason ("" when absent)."""
        found = self.client.get_model_repository_index(headers=self.headers)
        if self.protocol == "grpc":
            fields = ("name", "version", "state", "reason")
            found = [{f: getattr(m, f) for f in fields} for m in found.models]
        keys = ("version", "state", "reason")
        return {m["name"]: {k: m.get(k, "") for k in keys} for m in found}

    def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        text = None if config is None else json.dumps(config)
        self.client.load_model(model, headers=self.headers, config=text)

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self.client.unload_model(model, headers=self.headers, unload_dependents=unload_dependents)

    def config(self, model: str) -> dict[str, Any]:
        if self.protocol == "http":
            return dict(self.client.get_model_config(model))
        return dict(self.client.get_model_config(model, as_json=True)["config"])

    def infer(self, model: str, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        tensors = []
        for name, array in inputs.items():
            datatype = "BYTES" if array.dtype == object else "FP32"
            tensor = self.module.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return np.asarray(self.client.infer(model, tensors).as_numpy(output))

    def refused(self, call: Callable[[], Any], http_status: int) -> str:
        """Run ``call``, expect it to fail with ``http_status`` (or gRPC's); its message."""
        with pytest.raises(InferenceServerException) as caught:
            call()
        want = str(http_status) if self.protocol == "http" else str(GRPC_STATUS[http_status])
        assert caught.value.status() == want, caught.value
        return str(caught.value.message())

    def close(self) -> None:
        self.client.close()


@pytest.fixture(params=["http", "grpc"])
def triton(request: pytest.FixtureRequest, control_mesh: Mesh) -> Iterator[Triton]:
    client = Triton(request.param, control_mesh, MANAGEMENT_TOKEN)
    yield client
    client.close()


def torch_reference(build_models: ModuleType, model: str) -> Callable[[np.ndarray], np.ndarray]:
    module = build_models.reference_module(model)

    def run(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(module(torch.from_numpy(x)).numpy())

    return run


@pytest.fixture(scope="module")
def tiny_reference(build_models: ModuleType) -> Callable[[np.ndarray], np.ndarray]:
    return torch_reference(build_models, "tiny_mlp")


@pytest.fixture(scope="module")
def wide_reference(build_models: ModuleType) -> Callable[[np.ndarray], np.ndarray]:
    return torch_reference(build_models, "wide_mlp")


def rows(count: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width), dtype=np.float32)


def assert_tiny_mlp_serves(triton: Triton, reference: Callable[[np.ndarray], np.ndarray]) -> None:
    x = rows(3, 64, seed=11)
    got = triton.infer("tiny_mlp", {"INPUT0": x}, "OUTPUT0")
    np.testing.assert_allclose(got, reference(x), atol=1e-4)


def test_index_lists_the_models_loaded_at_start_ready_and_the_others_not_loaded(
    triton: Triton,
) -> None:
    index = triton.index()

    assert index["tiny_mlp"] == {"version": "1", "state": "READY", "reason": ""}
    others = set(COPIED) - {"tiny_mlp"} | {"broken_init", "bad_config"}
    for model in others:
        assert index[model] == {"version": "", "state": "UNAVAILABLE", "reason": "not loaded"}


def test_index_of_ready_models_lists_only_those_a_worker_serves(control_mesh: Mesh) -> None:
    response = httpx.post(
        f"{control_mesh.url}/v2/repository/index",
        json={"ready": True},
        headers={"Authorization": f"Bearer {MANAGEMENT_TOKEN}"},
        timeout=30,
    )

    assert response.status_code == 200, response.text
    ready = response.json()
    assert {m["name"] for m in ready} >= {"tiny_mlp"}
    assert all(m["state"] == "READY" for m in ready)
    assert not {m["name"] for m in ready} & {"broken_init", "bad_config"}


def test_a_loaded_model_answers_as_its_torch_reference(
    triton: Triton, wide_reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    assert not triton.client.is_model_ready("wide_mlp")

    triton.load("wide_mlp")
    try:
        assert triton.client.is_model_ready("wide_mlp")
        assert triton.index()["wide_mlp"]["state"] == "READY"
        x = rows(2, 1024, seed=3)
        got = triton.infer("wide_mlp", {"INPUT0": x}, "OUTPUT0")
        np.testing.assert_allclose(got, wide_reference(x), atol=1e-4)
    finally:
        triton.unload("wide_mlp")


def test_an_unloaded_model_is_refused_as_not_found_and_indexed_as_unloaded(
    triton: Triton,
) -> None:
    triton.load("tiny_mlp_onnx")

    triton.unload("tiny_mlp_onnx")

    x = rows(1, 64, seed=0)
    message = triton.refused(lambda: triton.infer("tiny_mlp_onnx", {"INPUT0": x}, "OUTPUT0"), 404)
    assert message == "Request for unknown model: 'tiny_mlp_onnx' is not found (unloaded)"
    assert not triton.client.is_model_ready("tiny_mlp_onnx")
    assert triton.index()["tiny_mlp_onnx"] == {
        "version": "",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }


def test_a_config_sent_with_the_load_replaces_the_file_until_the_next_load(
    triton: Triton, tiny_reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    triton.load("tiny_mlp_onnx", config=ONNX_OVERRIDE)
    try:
        config = triton.config("tiny_mlp_onnx")
        assert config["max_batch_size"] == 8
        assert [group["count"] for group in config["instance_group"]] == [2]
        x = rows(8, 64, seed=5)
        got = triton.infer("tiny_mlp_onnx", {"INPUT0": x}, "OUTPUT0")
        np.testing.assert_allclose(got, tiny_reference(x), atol=1e-4)
        too_many = rows(9, 64, seed=5)
        triton.refused(lambda: triton.infer("tiny_mlp_onnx", {"INPUT0": too_many}, "OUTPUT0"), 400)

        triton.load("tiny_mlp_onnx")  # no config: the file's again

        config = triton.config("tiny_mlp_onnx")
        assert config["max_batch_size"] == 64
        assert [group["count"] for group in config["instance_group"]] == [1]
        got = triton.infer("tiny_mlp_onnx", {"INPUT0": too_many}, "OUTPUT0")
        np.testing.assert_allclose(got, tiny_reference(too_many), atol=1e-4)
    finally:
        triton.unload("tiny_mlp_onnx")


def test_a_model_whose_initialize_raises_fails_its_load_with_the_reason_others_serve_on(
    triton: Triton, tiny_reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    message = triton.refused(lambda: triton.load("broken_init"), 400)

    assert message.startswith("failed to load 'broken_init': ")
    assert "its weights are missing on purpose" in message
    row = triton.index()["broken_init"]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"].startswith("load failed: ")
    assert "its weights are missing on purpose" in row["reason"]
    assert not triton.client.is_model_ready("broken_init")
    assert_tiny_mlp_serves(triton, tiny_reference)


def test_a_model_whose_config_is_invalid_fails_its_load_naming_file_and_field(
    triton: Triton, control_mesh: Mesh, tiny_reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    message = triton.refused(lambda: triton.load("bad_config"), 400)

    config_file = control_mesh.repository / "bad_config" / "config.yaml"
    assert message.startswith(f"failed to load 'bad_config': {config_file}: input.0.data_type")
    assert "TYPE_FLOAT" in message
    row = triton.index()["bad_config"]
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"] == "load failed: " + message.removeprefix("failed to load 'bad_config': ")
    assert_tiny_mlp_serves(triton, tiny_reference)


def test_a_pipeline_loads_with_its_steps_which_stop_with_it_only_with_unload_dependents(
    triton: Triton,
) -> None:
    triton.load(PIPELINE)

    index = triton.index()
    for model in (PIPELINE, *STEPS):
        assert index[model]["state"] == "READY", (model, index[model])
    text = np.array([["Weir serves models over Redis Streams."]], dtype=object)
    embedding = triton.infer(PIPELINE, {"TEXT": text}, "EMBEDDING")
    assert embedding.shape == (1, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding), 1.0, atol=1e-5)

    triton.unload(PIPELINE)

    index = triton.index()
    assert index[PIPELINE]["reason"] == "unloaded"
    assert all(index[step]["state"] == "READY" for step in STEPS), index

    triton.load(PIPELINE)
    triton.unload(PIPELINE, unload_dependents=True)

    index = triton.index()
    for model in (PIPELINE, *STEPS):
        assert index[model] == {"version": "", "state": "UNAVAILABLE", "reason": "unloaded"}


def test_repository_calls_need_the_management_token(
    triton: Triton, control_mesh: Mesh, tiny_reference: Callable[[np.ndarray], np.ndarray]
) -> None:
    anonymous = Triton(triton.protocol, control_mesh, token=None)
    wrong = Triton(triton.protocol, control_mesh, token="not-the-secret")
    before = triton.index()
    try:
        for client in (anonymous, wrong):
            client.refused(client.index, 401)
            client.refused(lambda c=client: c.load("wide_mlp"), 401)
            client.refused(lambda c=client: c.unload("tiny_mlp"), 401)
    finally:
        anonymous.close()
        wrong.close()

    assert triton.index() == before
    assert_tiny_mlp_serves(triton, tiny_reference)
    triton.load("wide_mlp")
    assert triton.index()["wide_mlp"]["state"] == "READY"
    triton.unload("wide_mlp")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_are_refused_outside_mode_explicit(
    request: pytest.FixtureRequest, mode: str, protocol: str
) -> None:
    mesh: Mesh = request.getfixturevalue("mesh" if mode == "none" else "poll_mesh")
    triton = Triton(protocol, mesh, token=None)
    try:
        for call in (lambda: triton.load("tiny_mlp"), lambda: triton.unload("tiny_mlp")):
            assert triton.refused(call, 503) == NOT_ALLOWED
        assert triton.index()["tiny_mlp"]["state"] == "READY"
        assert triton.client.is_model_ready("tiny_mlp")
    finally:
        triton.close()
