"""TorchServe's inference and management APIs on a real mesh, with real archives.

A TorchServe client's view: archives built by ``torch-model-archiver`` are registered through
the management port, called through ``/predictions`` and ``/explanations``, scaled, given a
new default version and unregistered, and every error comes back in TorchServe's shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml

from tests.conftest import Mesh, wait_until
from tests.torchserve.archives import build_archive, write_zip
from tests.torchserve.meshes import register as register_archive
from tests.torchserve.meshes import store_mesh
from weir.config_parameters import LOAD_TIMEOUT_S

TOKEN = "manage-me"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

ECHO = """
def handle(data, context):
    if data is None:
        return None
    answers = []
    for i, row in enumerate(data):
        value = row.get("data") or row.get("body")
        if isinstance(value, (bytes, bytearray)):
            value = value.decode()
        tag = row.get("tag")
        answers.append({
            "echo": value,
            "batch": len(data),
            "explain": context.get_request_header(i, "explain"),
            "tag": tag.decode() if isinstance(tag, (bytes, bytearray)) else tag,
            "version": VERSION,
        })
    return answers
"""

STATUS = """
class Status:
    def initialize(self, context):
        self.context = context

    def handle(self, data, context):
        answers = []
        for i, row in enumerate(data):
            context.set_response_content_type(i, "text/plain")
            if bytes(row["body"]) == b"created":
                context.set_response_status(201, "Created", i)
            answers.append("made " + bytes(row["body"]).decode())
        return answers
"""

SHORT = """
def handle(data, context):
    if data is None:
        return None
    return ["one answer"] * (len(data) + 1)
"""

SCORER = """
import torch
from ts.torch_handler.base_handler import BaseHandler


class Scorer(BaseHandler):
    def preprocess(self, data):
        rows = [row.get("data") or row.get("body") for row in data]
        return torch.tensor([row["features"] for row in rows], dtype=torch.float32)

    def postprocess(self, data):
        return [{"scores": row} for row in data.tolist()]
"""

BROKEN = """
class Broken:
    def initialize(self, context):
        raise ValueError("weights missing from the archive")

    def handle(self, data, context):
        return data
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    for name, version in (("echo", "1.0"), ("multi", "1.0"), ("lazy", "1.0")):
        build_archive(root, name, ECHO.replace("VERSION", repr(version)), version=version)
    newer = build_archive(root / "v2", "multi", ECHO.replace("VERSION", "'2.0'"), version="2.0")
    newer.rename(root / "multi-v2.mar")
    build_archive(root, "status", STATUS)
    build_archive(root, "short", SHORT)
    build_archive(root, "broken", BROKEN)
    write_zip(root / "corrupt.mar", {"MAR-INF/not-a-manifest.txt": "nothing here"})
    scorer_model().save(str(root / "scorer.pt"))
    build_archive(root, "scorer", SCORER, serialized_file=root / "scorer.pt")
    (root / ".weir").mkdir()
    return root


@pytest.fixture(scope="module")
def ts_mesh(store: Path) -> Iterator[tuple[Mesh, str]]:
    refresh = {"WEIR_CONTROL_REFRESH_S": "0.2"}
    with store_mesh(store, store / ".weir", TOKEN, **refresh) as (mesh, management):
        registered = register(
            management, "echo.mar", batch_size=8, max_batch_delay=50, startup_timeout=45
        )
        assert registered.status_code == 200, registered.text
        yield mesh, management


def scorer_model() -> torch.jit.ScriptModule:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Softmax(-1)).eval()
    return torch.jit.script(module)


def register(management: str, url: str, **params: Any) -> httpx.Response:
    return register_archive(management, TOKEN, url, **params)


def test_registering_an_archive_answers_as_torchserve(
    store: Path, ts_mesh: tuple[Mesh, str]
) -> None:
    _, management = ts_mesh
    listed = httpx.get(f"{management}/models", headers=AUTH).json()
    assert {"modelName": "echo", "modelUrl": "echo.mar"} in listed["models"]
    (described,) = httpx.get(f"{management}/models/echo", headers=AUTH).json()
    assert described["modelName"] == "echo"
    assert described["modelVersion"] == "1.0"
    assert described["batchSize"] == 8
    assert described["maxBatchDelay"] == 50
    assert described["minWorkers"] == 1
    assert (described["responseTimeout"], described["startupTimeout"]) == (120, 45)
    assert [w["status"] for w in described["workers"]] == ["READY"]
    # startup_timeout is the load timeout the workers enforce.
    config = yaml.safe_load((store / ".weir" / "echo" / "config.yaml").read_text())
    assert config["parameters"][LOAD_TIMEOUT_S] == "45"


def test_a_json_body_reaches_the_handler_parsed(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, _ = ts_mesh
    response = httpx.post(f"{mesh.url}/predictions/echo", json={"x": [1, 2]}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert answer["echo"] == {"x": [1, 2]}
    assert answer["explain"] == "False"


def test_put_and_versioned_paths_answer_as_post_and_other_methods_are_refused(
    ts_mesh: tuple[Mesh, str],
) -> None:
    mesh, _ = ts_mesh
    put = httpx.put(f"{mesh.url}/predictions/echo/1.0", content=b"put it", timeout=30)
    assert put.status_code == 200, put.text
    assert put.json()["echo"] == "put it"
    explained = httpx.put(f"{mesh.url}/explanations/echo/1.0", content=b"why", timeout=30)
    assert explained.status_code == 200, explained.text
    assert explained.json()["explain"] == "True"
    # Only POST and PUT predict; the app's routes answer the rest.
    assert httpx.get(f"{mesh.url}/predictions/echo", timeout=30).status_code == 405
    assert httpx.post(f"{mesh.url}/predictions/echo/1.0/more", timeout=30).status_code == 404


def test_form_files_and_query_parameters_reach_the_handler(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, _ = ts_mesh
    response = httpx.post(
        f"{mesh.url}/predictions/echo/1.0",
        params={"tag": "cat"},
        files={"data": ("kitten.txt", b"hello kitten", "text/plain")},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["echo"] == "hello kitten"
    assert response.json()["tag"] == "cat"


def test_explanations_tell_the_handler_to_explain(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, _ = ts_mesh
    response = httpx.post(f"{mesh.url}/explanations/echo", content=b"why", timeout=30)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "echo": "why",
        "batch": 1,
        "explain": "True",
        "tag": None,
        "version": "1.0",
    }


def test_the_handler_sets_each_answers_status_and_content_type(
    ts_mesh: tuple[Mesh, str],
) -> None:
    mesh, management = ts_mesh
    assert register(management, "status.mar").status_code == 200
    created = httpx.post(f"{mesh.url}/predictions/status", content=b"created", timeout=30)
    assert created.status_code == 201
    assert created.headers["content-type"].startswith("text/plain")
    assert created.text == "made created"
    plain = httpx.post(f"{mesh.url}/predictions/status", content=b"other", timeout=30)
    assert (plain.status_code, plain.text) == (200, "made other")


def test_thirty_clients_are_batched_while_another_archive_registers(
    ts_mesh: tuple[Mesh, str],
) -> None:
    mesh, management = ts_mesh

    async def client(http: httpx.AsyncClient, index: int) -> list[dict[str, Any]]:
        answers = []
        for round_ in range(5):
            response = await http.post(
                f"{mesh.url}/predictions/echo", content=f"{index}-{round_}".encode()
            )
            assert response.status_code == 200, response.text
            answers.append(response.json())
            assert answers[-1]["echo"] == f"{index}-{round_}"
        return answers

    async def run() -> list[list[dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=60) as http:
            clients = [client(http, i) for i in range(30)]
            registering = asyncio.to_thread(register, management, "short.mar")
            *answers, registered = await asyncio.gather(*clients, registering)
            assert registered.status_code == 200, registered.text
            return answers

    answers = [a for per_client in asyncio.run(run()) for a in per_client]
    assert len(answers) == 150
    assert max(a["batch"] for a in answers) > 1  # one handle() call took several requests


def test_errors_come_back_in_torchserves_shape(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh
    unknown = httpx.post(f"{mesh.url}/predictions/nope", content=b"x")
    assert unknown.status_code == 404
    assert unknown.json() == {
        "code": 404,
        "type": "ModelNotFoundException",
        "message": "Model not found: nope",
    }
    version = httpx.post(f"{mesh.url}/predictions/echo/9.0", content=b"x")
    assert version.status_code == 404
    assert version.json()["message"] == "Model version: 9.0 does not exist for model: echo"
    corrupt = register(management, "corrupt.mar")
    assert corrupt.status_code == 400
    assert "corrupt.mar" in corrupt.json()["message"]
    missing = register(management, "absent.mar")
    assert missing.status_code == 404
    untimed = register(management, "status.mar", startup_timeout=0)
    assert untimed.status_code == 400
    assert untimed.json()["message"] == "startup_timeout must be 1 or more, not 0"
    assert missing.json()["message"] == "Model not found at: absent.mar"
    other_handler = register(management, "status.mar", handler="image_classifier")
    assert other_handler.status_code == 400
    assert "Parameter handler is not supported" in other_handler.json()["message"]
    assert register(management, "status.mar", runtime="cpp").status_code == 400


def test_a_handler_answering_the_wrong_count_fails_each_request(
    ts_mesh: tuple[Mesh, str],
) -> None:
    mesh, management = ts_mesh
    if "short" not in httpx.get(f"{management}/models", headers=AUTH).text:
        assert register(management, "short.mar").status_code == 200
    response = httpx.post(f"{mesh.url}/predictions/short", content=b"x", timeout=30)
    assert response.status_code == 500
    body = response.json()
    assert body["code"] == 500
    assert body["type"] == "InternalServerException"
    assert "'short'" in body["message"]
    assert "expect: 1, got: 2" in body["message"]


def test_a_handler_failing_initialize_is_not_registered(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh
    response = register(management, "broken.mar")
    assert response.status_code == 500
    assert "weights missing from the archive" in response.json()["message"]
    assert httpx.get(f"{management}/models/broken", headers=AUTH).status_code == 404
    ok = httpx.post(f"{mesh.url}/predictions/echo", content=b"still here", timeout=30)
    assert ok.json()["echo"] == "still here"  # the other models go on


def test_versions_default_scale_and_unregister(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh

    def version_answering(path: str) -> str:
        response = httpx.post(f"{mesh.url}/predictions/{path}", content=b"v", timeout=30)
        assert response.status_code == 200, response.text
        return str(response.json()["version"])

    assert register(management, "multi.mar").status_code == 200
    assert register(management, "multi-v2.mar").status_code == 200
    assert version_answering("multi") == "1.0"  # the first registered stays the default
    assert version_answering("multi/2.0") == "2.0"
    default = httpx.put(f"{management}/models/multi/2.0/set-default", headers=AUTH)
    assert default.json() == {
        "status": 'Default version successfully updated for model "multi" to "2.0"'
    }
    assert version_answering("multi") == "2.0"
    scaled = httpx.put(
        f"{management}/models/multi",
        params={"min_worker": 2, "synchronous": "true"},
        headers=AUTH,
        timeout=120,
    )
    assert scaled.json() == {"status": "Workers scaled to 2 for model: multi"}
    every = httpx.get(f"{management}/models/multi/all", headers=AUTH).json()
    assert [(d["modelVersion"], d["minWorkers"]) for d in every] == [("1.0", 2), ("2.0", 2)]
    wait_until(
        lambda: all(
            len(d["workers"]) == 2
            for d in httpx.get(f"{management}/models/multi/all", headers=AUTH).json()
        ),
        30,
        "two instances of each version",
    )
    removed = httpx.delete(f"{management}/models/multi/1.0", headers=AUTH, timeout=120)
    assert removed.json() == {"status": 'Model "multi" unregistered'}
    assert version_answering("multi") == "2.0"
    gone = httpx.delete(f"{management}/models/multi", headers=AUTH, timeout=120)
    assert gone.status_code == 200
    after = httpx.post(f"{mesh.url}/predictions/multi", content=b"v", timeout=30)
    assert after.status_code == 404


def test_the_archive_answers_kserve_v2_requests_too(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, _ = ts_mesh
    body = {"inputs": [{"name": "body", "datatype": "BYTES", "shape": [1, 1], "data": ["v2 hi"]}]}
    response = httpx.post(f"{mesh.url}/v2/models/echo/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["status"]["data"] == [200]
    assert '"echo": "v2 hi"' in outputs["response"]["data"][0]


def test_ping_and_the_management_port_stay_apart(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh
    assert httpx.get(f"{mesh.url}/ping").json() == {"status": "Healthy"}
    assert httpx.get(f"{mesh.url}/models", headers=AUTH).status_code == 404
    assert httpx.get(f"{management}/v2/health/ready").status_code == 404
    refused = httpx.get(f"{management}/models")
    assert refused.status_code == 401
    assert refused.json()["code"] == 401


def test_a_base_handler_subclass_serves_its_torchscript_model(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh
    assert register(management, "scorer.mar", batch_size=4).status_code == 200
    rows = torch.randn(12, 4, generator=torch.Generator().manual_seed(3))

    async def ask(http: httpx.AsyncClient, row: list[float]) -> list[float]:
        response = await http.post(f"{mesh.url}/predictions/scorer", json={"features": row})
        assert response.status_code == 200, response.text
        return list(response.json()["scores"])

    async def run() -> list[list[float]]:
        async with httpx.AsyncClient(timeout=60) as http:
            return await asyncio.gather(*(ask(http, row) for row in rows.tolist()))

    got = torch.tensor(asyncio.run(run()))
    with torch.inference_mode():
        want = scorer_model()(rows)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_model_without_workers_answers_503_until_scaled(ts_mesh: tuple[Mesh, str]) -> None:
    mesh, management = ts_mesh
    registered = register(management, "lazy.mar", initial_workers=0)
    assert registered.json() == {
        "status": 'Model "lazy" Version: 1.0 registered with 0 initial workers. Use scale '
        "workers API to add workers for the model."
    }
    idle = httpx.post(f"{mesh.url}/predictions/lazy", content=b"x", timeout=30)
    assert idle.status_code == 503
    assert idle.json()["message"].startswith('Model "lazy" has no worker to serve')
    scaled = httpx.put(
        f"{management}/models/lazy",
        params={"min_worker": 1, "synchronous": "true"},
        headers=AUTH,
        timeout=120,
    )
    assert scaled.status_code == 200, scaled.text
    busy = httpx.post(f"{mesh.url}/predictions/lazy", content=b"x", timeout=30)
    assert busy.status_code == 200, busy.text
    assert busy.json()["echo"] == "x"
