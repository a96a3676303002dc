"""A prediction answers alike on the HTTP protocol's own path and through ASGI.

A plain target is answered by the protocol itself (``gateway.torchserve.direct_predictions``);
one with an escaped character goes through ASGI (``gateway.fastpath``). Both give the handler
the same body, query parameters and headers, and both keep the token, the body limit
(``max_request_size``, counted after decoding), compression, the handler's status and
headers, and TorchServe's error shape.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Mesh
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import register, store_mesh

TOKEN = "predict-me"
MANAGE = "manage-me"
LIMIT = 4096
HANDLER = """
import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for i, row in enumerate(data):
        body = row.get("body") or row.get("data")
        if isinstance(body, (bytes, bytearray)):
            body = body.decode()
        tag = row.get("tag")
        if body == "made":
            context.set_response_status(201, "Created", i)
        context.set_response_content_type(i, "application/x-echo")
        answers.append(json.dumps({
            "body": body,
            "tag": tag.decode() if isinstance(tag, (bytes, bytearray)) else tag,
            "trace": context.get_request_header(i, "x-trace"),
            "explain": context.get_request_header(i, "explain"),
        }))
    return answers
"""
# The protocol's own path, and ASGI's (an escaped character the protocol leaves to it).
PATHS = {"direct": "/predictions/echo", "asgi": "/predictions/ech%6F"}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    root = tmp_path_factory.mktemp("paths")
    store = root / "store"
    store.mkdir()
    build_archive(store, "echo", HANDLER, version="1.0")
    (root / "repository").mkdir()
    env = {
        "WEIR_GATEWAY_INFERENCE_TOKEN": TOKEN,
        "WEIR_GATEWAY_TS_MAX_REQUEST_SIZE_BYTES": str(LIMIT),
    }
    with store_mesh(store, root / "repository", MANAGE, **env) as (running, management):
        registered = register(management, MANAGE, "echo.mar")
        assert registered.status_code == 200, registered.text
        yield running


def post(mesh: Mesh, path: str, body: bytes, **headers: str) -> httpx.Response:
    sent = {"Authorization": f"Bearer {TOKEN}", **headers}
    return httpx.post(f"{mesh.url}{path}", content=body, headers=sent, timeout=30)


@pytest.mark.parametrize("way", PATHS)
def test_the_handler_gets_the_same_request_either_way(mesh: Mesh, way: str) -> None:
    answer = post(mesh, PATHS[way] + "?tag=blue", b"hello", **{"X-Trace": "t-1"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-echo"
    assert json.loads(answer.content) == {
        "body": "hello", "tag": "blue", "trace": "t-1", "explain": "False"
    }  # fmt: skip
    made = post(mesh, PATHS[way], b"made")
    assert made.status_code == 201
    explained = httpx.put(
        f"{mesh.url}{PATHS[way].replace('predictions', 'explanations')}/1.0",
        content=b"why",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert explained.status_code == 200, explained.text
    assert json.loads(explained.content)["explain"] == "True"


@pytest.mark.parametrize("way", PATHS)
def test_refusals_come_in_torchserves_shape_either_way(mesh: Mesh, way: str) -> None:
    path = PATHS[way]
    unauthorized = httpx.post(f"{mesh.url}{path}", content=b"x", timeout=30)
    assert unauthorized.status_code == 401
    assert unauthorized.json()["type"] == "InvalidKeyException"

    too_large = post(mesh, path, b"x" * (LIMIT + 1))
    assert too_large.status_code == 413
    assert too_large.json()["type"] == "TooLongFrameException"
    # The limit counts the decoded bytes: a small gzip body that decodes past it is refused.
    bomb = post(mesh, path, gzip.compress(b"y" * (LIMIT * 8)), **{"Content-Encoding": "gzip"})
    assert bomb.status_code == 413
    packed = post(mesh, path, gzip.compress(b"packed"), **{"Content-Encoding": "gzip"})
    assert packed.status_code == 200, packed.text
    assert json.loads(packed.content)["body"] == "packed"

    missing = post(mesh, path.replace("echo", "nobody").replace("ech%6F", "nob%6Fdy"), b"x")
    assert missing.status_code == 404
    assert missing.json() == {
        "code": 404, "type": "ModelNotFoundException", "message": "Model not found: nobody"
    }  # fmt: skip
