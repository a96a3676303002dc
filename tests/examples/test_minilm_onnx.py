"""The MiniLM pipeline with its encoder on ONNX Runtime embeds text as sentence-transformers.

``minilm_embed_onnx`` mixes backends in one pipeline: the python tokenizer, the encoder
exported to ``model.onnx`` and served by ONNX Runtime (its config filled from the file), and
the python pool. Every test goes through the session's real mesh (gateway, batcher, CPU
worker pool, redis-server): over HTTP with JSON, with tritonclient's HTTP client (binary
tensors) and its gRPC client. Concurrent requests of one sentence each are grouped by the
encoder's own batcher, which the model's statistics endpoint shows.

Besides the torch pipeline's check (cosine >= 0.999, unit length), embeddings agree with
sentence-transformers' to ``ATOL``: the ONNX graph runs the same float32 weights, and the
differences left are float32 rounding, which the batch a row runs in can change.
"""

from __future__ import annotations

import asyncio
import importlib.util
import queue
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from pipelines import load_pipelines
from tests.conftest import ROOT, Mesh
from tests.examples.helpers import SENTENCES, assert_same_embeddings, infer, reference_embeddings
from weir.repository import Repository

PIPELINE = "minilm_embed_onnx"
ENCODER = "minilm_encoder_onnx"
STEPS = ("minilm_tokenizer", ENCODER, "minilm_pool")
ATOL = 1e-5
CONCURRENT = 32


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    return reference_embeddings(SENTENCES)


@pytest.fixture
def grpc_client(mesh: Mesh) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    yield client
    client.close()


def text_array(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def grpc_text(texts: list[str]) -> grpcclient.InferInput:
    array = text_array(texts)
    tensor = grpcclient.InferInput("TEXT", list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    return tensor


def assert_matches(served: np.ndarray, expected: np.ndarray) -> None:
    assert_same_embeddings(served, expected)
    np.testing.assert_allclose(served, expected, rtol=0, atol=ATOL)


def json_body(texts: list[str]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts), 1], "data": texts}]
    }


def embedding_of(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert (output["name"], output["datatype"]) == ("EMBEDDING", "FP32")
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def batch_counts(mesh: Mesh, model: str) -> dict[int, int]:
    """Batches the model has run so far, by size, from its statistics endpoint."""
    response = httpx.get(f"{mesh.url}/v2/models/{model}/stats", timeout=10)
    assert response.status_code == 200, response.text
    (stats,) = response.json()["model_stats"]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_encoder_config_is_filled_from_the_onnx_file_with_the_torch_encoders_tensors(
    mesh: Mesh,
) -> None:
    def config(model: str) -> dict[str, Any]:
        response = httpx.get(f"{mesh.url}/v2/models/{model}/config", timeout=10)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    onnx, torch = config(ENCODER), config("minilm_encoder")
    assert onnx["backend"] == "onnxruntime"
    assert onnx["max_batch_size"] == torch["max_batch_size"] == 32
    for field in ("input", "output"):
        assert onnx[field] == torch[field], field
    assert [(t["name"], t["data_type"], t["dims"]) for t in onnx["output"]] == [
        ("token_embeddings", "TYPE_FP32", [128, 384])
    ]
    steps = config(PIPELINE)["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == list(STEPS)
    assert httpx.get(f"{mesh.url}/v2/models/{PIPELINE}/ready", timeout=10).status_code == 200


def load_minilm() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minilm", ROOT / "examples" / "minilm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_building_into_another_repository_copies_the_onnx_configs_and_keeps_built_files(
    example_repository: Path, tmp_path: Path
) -> None:
    # The built files are linked in, so the build only copies the committed sources: the
    # encoder's config.pbtxt among them, and the repository then loads the ONNX pipeline.
    built = {
        "minilm_tokenizer": "tokenizer.json",
        "minilm_encoder": "model.pt2",
        ENCODER: "model.onnx",
    }
    for model, filename in built.items():
        (tmp_path / model / "1").mkdir(parents=True)
        (tmp_path / model / "1" / filename).symlink_to(example_repository / model / "1" / filename)

    assert load_minilm().build(tmp_path) == []

    assert (tmp_path / ENCODER / "config.pbtxt").read_bytes() == (
        example_repository / ENCODER / "config.pbtxt"
    ).read_bytes()
    repository = Repository.load(tmp_path)
    assert set(repository.models) == {*STEPS, "minilm_encoder", "minilm_embed", PIPELINE}
    encoder = repository.models[ENCODER].config
    assert [(t.name, t.dims) for t in encoder.output] == [("token_embeddings", (128, 384))]
    assert PIPELINE in load_pipelines(repository)


def test_a_request_over_http_json_matches_sentence_transformers(
    mesh: Mesh, expected: np.ndarray
) -> None:
    url = f"{mesh.url}/v2/models/{PIPELINE}/infer"
    batch = embedding_of(httpx.post(url, json=json_body(SENTENCES), timeout=60))
    alone = embedding_of(httpx.post(url, json=json_body(SENTENCES[:1]), timeout=60))

    assert_matches(batch, expected)
    assert_matches(alone, expected[:1])
    # The torch pipeline, served beside it from the same tokenizer and pool, agrees.
    torch_url = f"{mesh.url}/v2/models/minilm_embed/infer"
    torch = embedding_of(httpx.post(torch_url, json=json_body(SENTENCES), timeout=60))
    np.testing.assert_allclose(batch, torch, rtol=0, atol=ATOL)


def test_a_request_with_tritonclient_http_binary_matches_sentence_transformers(
    mesh: Mesh, expected: np.ndarray
) -> None:
    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        served = infer(client, PIPELINE, {"TEXT": text_array(SENTENCES)})
    finally:
        client.close()
    assert list(served) == ["EMBEDDING"]
    assert_matches(served["EMBEDDING"], expected)


def test_a_request_over_grpc_matches_sentence_transformers(
    grpc_client: grpcclient.InferenceServerClient, expected: np.ndarray
) -> None:
    result = grpc_client.infer(PIPELINE, [grpc_text(SENTENCES)])
    assert_matches(result.as_numpy("EMBEDDING"), expected)


def send_http_json(mesh: Mesh, texts: list[str]) -> list[np.ndarray]:
    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=mesh.url, timeout=60) as client:
            return await asyncio.gather(
                *(client.post(f"/v2/models/{PIPELINE}/infer", json=json_body([t])) for t in texts)
            )

    return [embedding_of(response) for response in asyncio.run(send_all())]


def send_grpc(mesh: Mesh, texts: list[str]) -> list[np.ndarray]:
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(mesh.grpc_target)
    try:
        for i, text in enumerate(texts):
            client.async_infer(
                PIPELINE,
                [grpc_text([text])],
                lambda result, error, i=i: answers.put((i, result, error)),
                client_timeout=60,
            )
        replies = sorted((answers.get(timeout=90) for _ in texts), key=lambda a: a[0])
    finally:
        client.close()
    for _, _, error in replies:
        assert error is None, error
    return [result.as_numpy("EMBEDDING") for _, result, _ in replies]


@pytest.mark.parametrize("send", [send_http_json, send_grpc], ids=["http-json", "grpc"])
def test_concurrent_requests_are_batched_by_the_onnx_encoder_and_each_matches(
    mesh: Mesh, expected: np.ndarray, send: Callable[[Mesh, list[str]], list[np.ndarray]]
) -> None:
    # One sentence per request, all sent at once. Each step runs every request once, in
    # batches its own batcher forms; the encoder's hold more than one request (the first
    # may run alone, on an idle instance), and each request still gets its own vector.
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(CONCURRENT)]
    before = {step: batch_counts(mesh, step) for step in STEPS}

    served = np.concatenate(send(mesh, texts))

    assert_matches(served, np.tile(expected, (CONCURRENT // len(SENTENCES), 1)))
    for step in STEPS:
        after = batch_counts(mesh, step)
        ran = {size: n - before[step].get(size, 0) for size, n in after.items()}
        assert sum(size * n for size, n in ran.items()) == CONCURRENT, (step, ran)
        if step == ENCODER:
            assert max(size for size, n in ran.items() if n) > 1, ran
