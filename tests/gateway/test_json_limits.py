"""Triton's JSON limits over real HTTP: how deep ``data`` may nest, what a parameter may be.

No element of ``data`` (itself level 0) may sit at level 100 or deeper (Triton's
``HTTP_MAX_JSON_NESTING_DEPTH``), however the nesting is laid out; a parameter of the
request, an input or an output is a string, a number or a bool, and an object, a list or
null is a 400 naming it. Raw HTTP, since tritonclient never sends these.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import torch
import tritonclient.http as httpclient

from tests.conftest import Mesh

INFER = "/v2/models/tiny_mlp/infer"
TOO_DEEP = "input 'INPUT0': JSON nesting depth of 'data' exceeds maximum allowed limit (100)"


@pytest.fixture
def client(mesh: Mesh) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=mesh.url, timeout=30) as http:
        yield http


def row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 64), dtype=np.float32)


def tiny_reference(build_models: ModuleType, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()


def body_with_data(data: bytes, **top: Any) -> bytes:
    head = orjson.dumps({"name": "INPUT0", "datatype": "FP32", "shape": [1, 64]})
    tensor = head[:-1] + b',"data":' + data + b"}"
    rest = b"".join(b',"%s":%s' % (k.encode(), orjson.dumps(v)) for k, v in top.items())
    return b'{"inputs":[' + tensor + b"]" + rest + b"}"


def nested(x: np.ndarray, lists: int) -> bytes:
    """``x``'s 64 values in one list, wrapped in more lists: ``lists`` levels in all."""
    return b"[" * (lists - 1) + orjson.dumps(x.reshape(-1).tolist()) + b"]" * (lists - 1)


def lopsided(x: np.ndarray, lists: int) -> bytes:
    """63 values at level 1, the last one ``lists`` levels down (ragged nesting)."""
    values = x.reshape(-1).tolist()
    deep = b"[" * (lists - 1) + orjson.dumps(values[-1]) + b"]" * (lists - 1)
    return orjson.dumps(values[:-1])[:-1] + b"," + deep + b"]"


def answer(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


@pytest.mark.parametrize("layout", [nested, lopsided])
def test_data_whose_elements_sit_at_level_99_is_served(
    client: httpx.Client, build_models: ModuleType, layout: Any
) -> None:
    x = row(30)
    got = answer(client.post(INFER, content=body_with_data(layout(x, 99))))
    np.testing.assert_allclose(got, tiny_reference(build_models, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("lists", [100, 101, 500, 1021])
@pytest.mark.parametrize("layout", [nested, lopsided])
def test_data_nested_to_level_100_is_a_400_in_tritons_words(
    client: httpx.Client, layout: Any, lists: int
) -> None:
    response = client.post(INFER, content=body_with_data(layout(row(31), lists)))
    assert response.status_code == 400, response.text[:300]
    assert response.json() == {"error": TOO_DEEP}


def test_deep_bytes_data_is_a_400_too(mesh: Mesh) -> None:
    data = b"[" * 100 + b'"text"' + b"]" * 100
    body = b'{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1,1],"data":%s}]}' % data
    response = httpx.post(f"{mesh.url}/v2/models/minilm_tokenizer/infer", content=body)
    assert response.status_code == 400
    assert "input 'TEXT': JSON nesting depth of 'data' exceeds" in response.json()["error"]


@pytest.mark.parametrize("token", [b"0.5", b"NaN"], ids=["plain", "with-nan"])
def test_json_nested_far_past_the_parsers_limit_is_a_quick_400(
    client: httpx.Client, token: bytes
) -> None:
    # orjson stops at 1024 levels; the NaN body takes the other parser, bounded as well.
    # 20 000 lists stay under what tiny_mlp's shape allows (gateway.json_bounds), so the
    # parsers meet them.
    deep = b"[" * 20_000 + token + b"]" * 20_000
    started = time.monotonic()
    response = client.post(INFER, content=body_with_data(deep))
    assert response.status_code == 400, response.text[:300]
    assert "not valid JSON" in response.json()["error"]
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("token", [b"0.5", b"NaN"], ids=["plain", "with-nan"])
def test_json_nested_past_what_the_shape_allows_is_refused_unparsed(
    client: httpx.Client, token: bytes
) -> None:
    deep = b"[" * 200_000 + token + b"]" * 200_000
    started = time.monotonic()
    response = client.post(INFER, content=body_with_data(deep))
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"].startswith(
        "the JSON of the request holds more than 20545 commas, lists and objects"
    )
    assert time.monotonic() - started < 2.0


BAD_VALUES = [({"k": 1}, "an object"), ([1, 2], "a list"), (None, "null")]


@pytest.mark.parametrize(("value", "kind"), BAD_VALUES, ids=["object", "list", "null"])
@pytest.mark.parametrize("where", ["request", "input", "output"])
def test_a_parameter_that_is_not_a_string_number_or_bool_is_a_400_naming_it(
    client: httpx.Client, where: str, value: Any, kind: str
) -> None:
    body = orjson.loads(body_with_data(orjson.dumps(row(32).tolist())))
    holder = {
        "request": body,
        "input": body["inputs"][0],
        "output": (body.setdefault("outputs", [{"name": "OUTPUT0"}]))[0],
    }[where]
    holder["parameters"] = {"fine": "yes", "custom_thing": value}
    response = client.post(INFER, content=orjson.dumps(body))
    assert response.status_code == 400, response.text
    named = {"request": "request", "input": "input 'INPUT0'", "output": "output 'OUTPUT0'"}
    assert response.json() == {
        "error": f"{named[where]} parameter 'custom_thing' has invalid type ({kind}); "
        "a parameter is a string, a number or a bool"
    }


@pytest.mark.parametrize(
    ("key", "place"), [("binary_data_output", "request"), ("binary_data", "output 'OUTPUT0'")]
)
@pytest.mark.parametrize("value", ["false", 0, 1.0])
def test_tritons_bool_parameters_must_be_bools(
    client: httpx.Client, key: str, place: str, value: Any
) -> None:
    body = orjson.loads(body_with_data(orjson.dumps(row(33).tolist())))
    body["outputs"] = [{"name": "OUTPUT0"}]
    holder = body if place == "request" else body["outputs"][0]
    holder["parameters"] = {key: value}
    response = client.post(INFER, content=orjson.dumps(body))
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(f"{place} parameter '{key}' must be a bool")


def test_string_number_and_bool_parameters_are_served_with_tritonclient(
    mesh: Mesh, build_models: ModuleType
) -> None:
    x = row(34)
    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        tensor = httpclient.InferInput("INPUT0", [1, 64], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer(
            "tiny_mlp",
            [tensor],
            parameters={"label": "a string", "count": 3, "ratio": 0.5, "flag": True},
        )
    finally:
        client.close()
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT0"), tiny_reference(build_models, x), rtol=1e-4, atol=1e-5
    )
