"""A model's max_input_bytes parameter refuses one huge request (413) before it is queued."""

from __future__ import annotations

import httpx

from tests.conftest import Mesh


def embed(mesh: Mesh, text: str) -> httpx.Response:
    body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    return httpx.post(f"{mesh.url}/v2/models/minilm_embed/infer", json=body, timeout=60)


def test_a_text_past_the_pipelines_max_input_bytes_is_a_413(mesh: Mesh) -> None:
    refused = embed(mesh, "word " * 20_000)  # 100 000 bytes, over 65 536
    assert refused.status_code == 413
    assert refused.json() == {
        "error": "the inputs of model 'minilm_embed' hold 100004 bytes, over its "
        "max_input_bytes parameter (65536)"
    }
    assert embed(mesh, "a short sentence").status_code == 200


def test_the_step_model_takes_its_own_limit_too(mesh: Mesh) -> None:
    body = {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["x" * 70_000]}]
    }
    response = httpx.post(f"{mesh.url}/v2/models/minilm_tokenizer/infer", json=body, timeout=60)
    assert response.status_code == 413
