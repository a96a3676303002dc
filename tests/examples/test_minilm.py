"""The MiniLM pipeline embeds text exactly as sentence-transformers does, step by step.

The three steps run in-process on the built example repository, each through its own
backend and ``BatchRunner`` with one request per sentence (so every step batches across
requests), routed by the pipeline's plan: the same path the mesh takes, without Redis.
The same steps also run as models of a real mesh, called one after the other over HTTP.
The reference is ``SentenceTransformer(<the package's model dir>).encode``, offline.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from pipelines import Pipeline, Step, load_pipelines
from tests.conftest import Mesh
from tests.examples.helpers import SENTENCES, assert_same_embeddings, infer, reference_embeddings
from weir.repository import Repository
from weir.tensors import Tensor
from weir.wire import InferRequest
from workers.backends import load_backend
from workers.execution import BatchRunner

_IDS = itertools.count()


@pytest.fixture(scope="module")
def repository(example_repository: Path) -> Repository:
    return Repository.load(example_repository)


@pytest.fixture(scope="module")
def pipeline(repository: Repository) -> Pipeline:
    return load_pipelines(repository)["minilm_embed"]


@pytest.fixture(scope="module")
def runners(repository: Repository, pipeline: Pipeline) -> dict[int, BatchRunner]:
    return {
        step.index: BatchRunner(
            step.config,
            load_backend(step.config, repository.models[step.model].version_path(step.version)),
        )
        for step in pipeline.steps
    }


def run_step(
    step: Step, runner: BatchRunner, per_request: list[dict[str, Tensor]]
) -> list[dict[str, Tensor]]:
    """One batch of the step over every request; returns each request's new tensors."""
    requests = [
        InferRequest(f"r{next(_IDS)}", step.model, step.version, step.model_inputs(t), "", 0)
        for t in per_request
    ]
    replies, executions = runner.run(requests)
    assert executions == [len(requests)], "the step ran the requests as one batch"
    for reply in replies:
        reply.raise_for_error()
    return [step.pipeline_outputs(reply.outputs) for reply in replies]


def embed(pipeline: Pipeline, runners: dict[int, BatchRunner], texts: list[str]) -> np.ndarray:
    plan = pipeline.plan()
    tensors = [
        {"TEXT": Tensor.from_numpy(np.array([[text.encode()]], dtype=object))} for text in texts
    ]
    available, started = set(pipeline.inputs), set()
    while not plan.is_complete(available):
        ready = plan.ready(available, started)
        assert ready, "the plan always has a ready step until it is complete"
        for step in ready:
            started.add(step.index)
            produced = run_step(step, runners[step.index], tensors)
            for mine, new in zip(tensors, produced, strict=True):
                mine.update(new)
            available.update(step.produces)
    return np.concatenate([t["EMBEDDING"].to_numpy() for t in tensors])


@pytest.fixture(scope="module")
def expected() -> np.ndarray:
    """sentence-transformers' own embeddings of SENTENCES, loaded offline from the package."""
    return reference_embeddings(SENTENCES)


def test_pipeline_embedding_matches_sentence_transformers(
    pipeline: Pipeline, runners: dict[int, BatchRunner], expected: np.ndarray
) -> None:
    assert_same_embeddings(embed(pipeline, runners, SENTENCES), expected)


def test_steps_served_by_the_mesh_chain_to_the_same_embedding(
    mesh: Mesh, expected: np.ndarray
) -> None:
    # BYTES in as JSON to the python tokenizer, then binary tensors (tritonclient's
    # default) through the encoder and the python pool: each step a model of the mesh.
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [4, 1], "data": SENTENCES}]}
    reply = httpx.post(f"{mesh.url}/v2/models/minilm_tokenizer/infer", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    tokens = {
        o["name"]: np.array(o["data"], dtype=np.int64).reshape(o["shape"])
        for o in reply.json()["outputs"]
    }
    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    hidden = infer(client, "minilm_encoder", tokens)["token_embeddings"]
    pooled = infer(
        client,
        "minilm_pool",
        {"token_embeddings": hidden, "attention_mask": tokens["attention_mask"]},
    )

    assert hidden.shape == (4, 128, 384)
    assert_same_embeddings(pooled["embedding"], expected)


def test_embedding_of_a_sentence_does_not_depend_on_its_batch_mates(
    pipeline: Pipeline, runners: dict[int, BatchRunner]
) -> None:
    alone = embed(pipeline, runners, SENTENCES[:1])
    batched = embed(pipeline, runners, SENTENCES)

    np.testing.assert_allclose(alone[0], batched[0], atol=1e-5)


def test_tokenizer_pads_every_row_to_128_tokens(
    pipeline: Pipeline, runners: dict[int, BatchRunner]
) -> None:
    step = pipeline.steps[0]
    texts = [{"TEXT": Tensor.from_numpy(np.array([[b"hello world"]], dtype=object))}]
    (produced,) = run_step(step, runners[step.index], texts)

    ids, mask = produced["ids"].to_numpy(), produced["mask"].to_numpy()
    assert ids.shape == mask.shape == (1, 128)
    assert ids[0, :4].tolist() == [101, 7592, 2088, 102]  # [CLS] hello world [SEP]
    assert mask[0].sum() == 4 and not ids[0, 4:].any()


def test_pipeline_served_by_the_mesh_matches_sentence_transformers(
    mesh: Mesh, expected: np.ndarray
) -> None:
    # One request to the ensemble: the gateway starts the route, each step runs in its own
    # model's batcher and pool, the embedding comes back.
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [4, 1], "data": SENTENCES}]}
    reply = httpx.post(f"{mesh.url}/v2/models/minilm_embed/infer", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    (output,) = reply.json()["outputs"]
    assert output["name"] == "EMBEDDING"
    served = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    assert_same_embeddings(served, expected)

    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    text = np.array([[s.encode()] for s in SENTENCES], dtype=object)
    assert_same_embeddings(infer(client, "minilm_embed", {"TEXT": text})["EMBEDDING"], expected)
