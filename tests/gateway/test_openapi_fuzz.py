"""Schemathesis fuzzes the gateway from its OpenAPI: no 5xx, every error in the KServe shape.

The gateway's published OpenAPI (FastAPI's ``/openapi.json``) describes paths and path and
query parameters, but not the infer request body: the route reads the raw body itself, to
take JSON and Triton's binary tensor data extension alike. So the published schema fuzzes
every operation's parameters, and a second schema, the published one with a KServe v2
inference request added to the infer operations (``KSERVE_INFER_REQUEST`` below), fuzzes
infer bodies and the ``Inference-Header-Content-Length`` header, valid and invalid.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.core.transport import Response
from schemathesis.schemas import BaseSchema

from tests.conftest import Mesh
from weir import datatypes

MODELS = ["tiny_mlp", "wide_mlp"]
REQUEST_TIMEOUT_S = 30.0

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,  # nothing written into the repository (.hypothesis/)
    suppress_health_check=list(HealthCheck),
)

# What the infer operations' OpenAPI could say: KServe v2's inference request, JSON or JSON
# followed by binary tensors, and the error shape every non-2xx answer uses.
PARAMETER_VALUE = {"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}
KSERVE_SCHEMAS: dict[str, Any] = {
    "InferParameters": {
        "type": "object",
        "properties": {
            "binary_data_output": {"type": "boolean"},
            # Microseconds; may only lower the server's deadline (a 504 when it passes).
            "timeout": {"type": "integer", "minimum": 1},
        },
        "additionalProperties": PARAMETER_VALUE,
    },
    "InferTensorParameters": {
        "type": "object",
        "properties": {
            "binary_data_size": {"type": "integer", "minimum": 0},
            "binary_data": {"type": "boolean"},
        },
        "additionalProperties": PARAMETER_VALUE,
    },
    "InferRequestInput": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"type": "string", "enum": sorted(datatypes.DATATYPES)},
            "parameters": {"$ref": "#/components/schemas/InferTensorParameters"},
            # Flat or nested row-major; absent when parameters.binary_data_size is given.
            "data": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {"type": "number"},
                        {"type": "boolean"},
                        {"type": "string"},
                        {"type": "array"},
                    ]
                },
            },
        },
    },
    "InferRequestOutput": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "parameters": {"$ref": "#/components/schemas/InferTensorParameters"},
        },
    },
    "InferRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"$ref": "#/components/schemas/InferParameters"},
            "inputs": {
                "type": "array",
                "minItems": 1,
                "items": {"$ref": "#/components/schemas/InferRequestInput"},
            },
            "outputs": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/InferRequestOutput"},
            },
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
        "additionalProperties": False,
    },
}
KSERVE_INFER_REQUEST: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}},
        # The JSON header, then each binary input's bytes in order.
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    },
}
HEADER_LENGTH_PARAMETER = {
    "name": "Inference-Header-Content-Length",
    "in": "header",
    "required": False,
    "description": "Length of the JSON header when binary tensors follow it.",
    "schema": {"type": "integer", "minimum": 0},
}
KSERVE_ERROR_RESPONSE = {
    "description": "KServe error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def with_kserve_infer_request(published: dict[str, Any]) -> dict[str, Any]:
    """The published OpenAPI, its infer operations given a body, header and error schemas."""
    spec = copy.deepcopy(published)
    spec.setdefault("components", {}).setdefault("schemas", {}).update(KSERVE_SCHEMAS)
    for path, operations in spec["paths"].items():
        if not path.endswith("/infer"):
            continue
        infer = operations["post"]
        infer["requestBody"] = KSERVE_INFER_REQUEST
        # FastAPI publishes the unversioned route's `version` argument as a query parameter
        # (`?version=7` is a 404); leave it out so generated bodies reach the codec.
        infer["parameters"] = [
            p for p in infer.get("parameters", []) if (p["in"], p["name"]) != ("query", "version")
        ]
        for parameter in infer["parameters"]:
            # Known models and versions, so requests get past routing into the codec.
            if parameter["name"] == "model":
                parameter["schema"] = {"type": "string", "enum": MODELS}
            elif parameter["name"] == "version" and parameter["in"] == "path":
                parameter["schema"] = {"type": "string", "enum": ["1"]}
        infer["parameters"].append(HEADER_LENGTH_PARAMETER)
        for status in ("400", "404", "413", "503", "504"):
            infer["responses"][status] = KSERVE_ERROR_RESPONSE
    return spec


TORCHSERVE_PATHS = ("/predictions/", "/explanations/", "/ping")


def kserve_error_shape(ctx: Any, response: Response, case: Case) -> None:
    """Every non-2xx answer is ``{"error": "<message>"}`` (TorchServe's routes: its shape)."""
    if 200 <= response.status_code < 300:
        return
    assert response.headers.get("content-type") == ["application/json"], response.headers
    error = response.json()
    if case.path.startswith(TORCHSERVE_PATHS):
        assert isinstance(error, dict), error
        if case.path == "/ping":
            assert error == {"status": "Unhealthy"}, error
            return
        assert set(error) == {"code", "type", "message"}, error
        assert error["code"] == response.status_code, error
        assert isinstance(error["message"], str) and error["message"], error
        return
    assert isinstance(error, dict) and set(error) == {"error"}, error
    assert isinstance(error["error"], str) and error["error"], error


def deadline_requested(case: Case) -> bool:
    """Whether the request's own ``timeout`` parameter may explain a 504."""
    body = case.body if isinstance(case.body, dict) else {}
    parameters = body.get("parameters")
    timeout = parameters.get("timeout") if isinstance(parameters, dict) else None
    return isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0


def unavailable_by_design(case: Case, response: Response) -> bool:
    """503 (UNAVAILABLE) by design: CUDA shared memory, until the GPU pool supports it, and
    model load and unload, which Triton refuses so outside mode explicit (this mesh's none).
    """
    if response.status_code != 503:
        return False
    control = case.path.startswith("/v2/repository/models/") and (
        case.path.endswith(("/load", "/unload", "/traffic"))
    )
    return control or case.path.startswith("/v2/cudasharedmemory")


def call_and_check(case: Case, mesh: Mesh) -> Response:
    response = case.call(base_url=mesh.url, timeout=REQUEST_TIMEOUT_S)
    checks = [kserve_error_shape]
    expected_5xx = response.status_code == 504 and deadline_requested(case)
    if not (expected_5xx or unavailable_by_design(case, response)):
        checks.insert(0, not_a_server_error)
    try:
        case.validate_response(response, checks=checks)
    except FailureGroup as exc:
        # A BaseExceptionGroup, which Hypothesis would let through without shrinking.
        raise AssertionError(str(exc)) from None
    return response


def fuzz(schema: BaseSchema, mesh: Mesh, mode: GenerationMode) -> list[str]:
    """Fuzz each operation of ``schema`` in turn; returns the operations' labels."""
    labels = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # a malformed operation
        operation = result.ok()
        labels.append(operation.label)
        negatable = [*operation.query, *operation.headers, *operation.cookies]
        if mode is GenerationMode.NEGATIVE and not (negatable or operation.body):
            # A string path parameter has no invalid value: only GET /v2, the health routes
            # and the versioned routes of the published schema have nothing else to negate.
            continue

        @FUZZ
        @given(case=operation.as_strategy(mode))
        def property_(case: Case) -> None:
            call_and_check(case, mesh)

        property_()
    return labels


# schemathesis.pytest's lazy fixtures set `Item._nodeid`, which pytest 9 no longer has; plain
# Hypothesis over each operation's strategy needs no plugin.
@pytest.mark.parametrize("mode", list(GenerationMode), ids=str)
def test_every_published_operation_answers_fuzzed_requests_without_a_5xx(
    mesh: Mesh, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{mesh.url}/openapi.json")
    labels = fuzz(schema, mesh, mode)
    assert "POST /v2/models/{model}/infer" in labels, labels


@pytest.mark.parametrize("mode", list(GenerationMode), ids=str)
def test_infer_answers_fuzzed_kserve_bodies_without_a_5xx(mesh: Mesh, mode: GenerationMode) -> None:
    published = httpx.get(f"{mesh.url}/openapi.json").raise_for_status().json()
    schema = schemathesis.openapi.from_dict(with_kserve_infer_request(published))
    labels = fuzz(schema.include(path_regex=r"/infer$"), mesh, mode)
    assert len(labels) == 2, labels


def test_the_mesh_still_serves_after_the_fuzzing(mesh: Mesh) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}]
    }
    response = httpx.post(f"{mesh.url}/v2/models/tiny_mlp/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [1, 16]
