"""Paths are routed raw: an encoded '/' cannot smuggle a route past a proxy's path rule."""

from __future__ import annotations

import httpx

from tests.conftest import Mesh


def test_an_encoded_slash_never_reaches_the_infer_route(mesh: Mesh) -> None:
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp%2Finfer", json={"inputs": []})
    assert response.status_code == 400
    assert response.json() == {"error": "an encoded '/' (%2F) is not allowed in a path"}


def test_an_encoded_slash_in_any_route_is_a_400_lower_case_too(mesh: Mesh) -> None:
    response = httpx.get(f"{mesh.url}/v2/models/tiny%2fmlp/ready")
    assert response.status_code == 400
    torchserve = httpx.post(f"{mesh.url}/predictions/a%2Fb", content=b"x")
    assert torchserve.status_code == 400
    assert set(torchserve.json()) == {"code", "type", "message"}


def test_other_escapes_still_route_as_their_characters(mesh: Mesh) -> None:
    assert httpx.get(f"{mesh.url}/v2/models/tiny_ml%70/ready").status_code == 200
