"""Health, server and model metadata, and model config, in Triton's shapes."""

from __future__ import annotations

import httpx

from tests.conftest import Mesh


def test_health_endpoints_report_live_and_ready(mesh: Mesh) -> None:
    assert httpx.get(f"{mesh.url}/v2/health/live").status_code == 200
    assert httpx.get(f"{mesh.url}/v2/health/ready").status_code == 200
    assert httpx.get(f"{mesh.url}/v2/models/tiny_mlp/ready").status_code == 200
    assert httpx.get(f"{mesh.url}/v2/models/tiny_mlp/versions/1/ready").status_code == 200
    assert httpx.get(f"{mesh.url}/v2/models/missing/ready").status_code == 404


def test_server_metadata_names_weir_and_its_extensions(mesh: Mesh) -> None:
    body = httpx.get(f"{mesh.url}/v2").json()
    assert body["name"] == "weir"
    assert "binary_tensor_data" in body["extensions"]


def test_model_metadata_has_batch_dimension_and_platform(mesh: Mesh) -> None:
    body = httpx.get(f"{mesh.url}/v2/models/tiny_mlp").json()
    assert body == {
        "name": "tiny_mlp",
        "versions": ["1"],
        "platform": "pytorch_libtorch",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]}],
    }


def test_model_config_uses_model_config_proto_names(mesh: Mesh) -> None:
    body = httpx.get(f"{mesh.url}/v2/models/wide_mlp/config").json()
    assert body["max_batch_size"] == 64
    assert body["input"][0]["data_type"] == "TYPE_FP32"
    assert body["input"][0]["dims"] == [1024]
    assert body["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert body["instance_group"][0]["kind"] == "KIND_CPU"
    assert body["version_policy"] == {"latest": {"num_versions": 1}}
    unknown = httpx.get(f"{mesh.url}/v2/models/wide_mlp/versions/9/config")
    assert unknown.status_code == 404
