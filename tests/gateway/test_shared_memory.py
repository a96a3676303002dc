"""Triton's system shared-memory extension, with tritonclient HTTP and gRPC unmodified.

The client creates and fills POSIX shm objects with ``tritonclient.utils.shared_memory``,
registers them with the session mesh's gateway, and infers tiny_mlp (INPUT0 FP32 [-1,64] ->
OUTPUT0 FP32 [-1,16]) through them; outputs are compared with the model run in-process.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.conftest import Mesh

ROWS = 3
INPUT_BYTES = ROWS * 64 * 4
OUTPUT_BYTES = ROWS * 16 * 4
OUTPUT_OFFSET = 64  # the output lies past the start of its region


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:12]


@contextlib.contextmanager
def shm_object(key: str, byte_size: int) -> Iterator[Any]:
    """A client-side shm object, destroyed at the end unless the test destroyed it."""
    handle = shm.create_shared_memory_region(key, key, byte_size, create_only=True)
    try:
        yield handle
    finally:
        if key in shm.mapped_shared_memory_regions():
            shm.destroy_shared_memory_region(handle)


def rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, 64), dtype=np.float32)


def reference(build_models: ModuleType, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()


def raises(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def http_shm_infer(client: httpclient.InferenceServerClient, inp: str, out: str | None) -> Any:
    tensor = httpclient.InferInput("INPUT0", [ROWS, 64], "FP32")
    tensor.set_shared_memory(inp, INPUT_BYTES)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    if out is not None:
        output.set_shared_memory(out, OUTPUT_BYTES, offset=OUTPUT_OFFSET)
    return client.infer("tiny_mlp", [tensor], outputs=[output])


def grpc_shm_infer(client: grpcclient.InferenceServerClient, inp: str, out: str | None) -> Any:
    tensor = grpcclient.InferInput("INPUT0", [ROWS, 64], "FP32")
    tensor.set_shared_memory(inp, INPUT_BYTES)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    if out is not None:
        output.set_shared_memory(out, OUTPUT_BYTES, offset=OUTPUT_OFFSET)
    return client.infer("tiny_mlp", [tensor], outputs=[output])


@contextlib.contextmanager
def registered_pair(client: Any, unique: str, x: np.ndarray) -> Iterator[tuple[str, str, Any]]:
    """An input region holding ``x`` and an output region, registered with ``client``."""
    inp, out = f"in_{unique}", f"out_{unique}"
    with (
        shm_object(f"/{inp}", INPUT_BYTES) as in_handle,
        shm_object(f"/{out}", OUTPUT_OFFSET + OUTPUT_BYTES) as out_handle,
    ):
        shm.set_shared_memory_region(in_handle, [x])
        client.register_system_shared_memory(inp, f"/{inp}", INPUT_BYTES)
        client.register_system_shared_memory(out, f"/{out}", OUTPUT_OFFSET + OUTPUT_BYTES)
        try:
            yield inp, out, out_handle
        finally:
            client.unregister_system_shared_memory(inp)
            client.unregister_system_shared_memory(out)


def output_of(handle: Any) -> np.ndarray:
    return shm.get_contents_as_numpy(handle, np.float32, [ROWS, 16], offset=OUTPUT_OFFSET)


# --- round trips -------------------------------------------------------------------------------


def test_http_reads_inputs_from_and_writes_outputs_to_shared_memory(
    triton_http: httpclient.InferenceServerClient, build_models: ModuleType, unique: str
) -> None:
    x = rows(1)
    with registered_pair(triton_http, unique, x) as (inp, out, out_handle):
        result = http_shm_infer(triton_http, inp, out)
        # As Triton: the output is described, its data is in the region alone.
        assert result.get_output("OUTPUT0") == {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [ROWS, 16],
        }
        np.testing.assert_allclose(output_of(out_handle), reference(build_models, x), atol=1e-4)


def test_http_input_in_shared_memory_with_the_output_in_the_response(
    triton_http: httpclient.InferenceServerClient, build_models: ModuleType, unique: str
) -> None:
    x = rows(2)
    with registered_pair(triton_http, unique, x) as (inp, _, _):
        result = http_shm_infer(triton_http, inp, None)
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT0"), reference(build_models, x), atol=1e-4
        )


def test_grpc_reads_inputs_from_and_writes_outputs_to_shared_memory(
    triton_grpc: grpcclient.InferenceServerClient, build_models: ModuleType, unique: str
) -> None:
    x = rows(3)
    with registered_pair(triton_grpc, unique, x) as (inp, out, out_handle):
        result = grpc_shm_infer(triton_grpc, inp, out)
        response = result.get_response()
        (output,) = response.outputs
        assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", "FP32", [ROWS, 16])
        assert list(response.raw_output_contents) == [b""]  # as Triton: an empty entry
        np.testing.assert_allclose(output_of(out_handle), reference(build_models, x), atol=1e-4)


def test_grpc_mixes_a_shared_input_with_outputs_in_the_response(
    triton_grpc: grpcclient.InferenceServerClient, build_models: ModuleType, unique: str
) -> None:
    x = rows(4)
    with registered_pair(triton_grpc, unique, x) as (inp, _, _):
        result = grpc_shm_infer(triton_grpc, inp, None)
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT0"), reference(build_models, x), atol=1e-4
        )


def test_a_region_registered_over_http_serves_grpc(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    build_models: ModuleType,
    unique: str,
) -> None:
    x = rows(5)
    with registered_pair(triton_http, unique, x) as (inp, out, out_handle):
        grpc_shm_infer(triton_grpc, inp, out)
        np.testing.assert_allclose(output_of(out_handle), reference(build_models, x), atol=1e-4)


# --- status and unregister ---------------------------------------------------------------------


def test_status_lists_the_region_and_unregister_removes_it(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    unique: str,
) -> None:
    name, key = f"st_{unique}", f"/st_{unique}"
    with shm_object(key, 4096):
        triton_http.register_system_shared_memory(name, key, 1024, offset=2048)
        want = {"name": name, "key": key, "offset": 2048, "byte_size": 1024}
        assert want in triton_http.get_system_shared_memory_status()
        assert triton_http.get_system_shared_memory_status(name) == [want]
        status = triton_grpc.get_system_shared_memory_status(name, as_json=True)
        assert status["regions"][name] == {**want, "offset": "2048", "byte_size": "1024"}
        triton_http.unregister_system_shared_memory(name)
        assert all(
            region["name"] != name for region in triton_http.get_system_shared_memory_status()
        )
        error = raises(lambda: triton_http.get_system_shared_memory_status(name))
        assert error.status() == "404"
        assert f"Unable to find system shared memory region: '{name}'" in error.message()
        grpc_error = raises(lambda: triton_grpc.get_system_shared_memory_status(name))
        assert grpc_error.status() == str(grpc.StatusCode.NOT_FOUND)
        triton_http.unregister_system_shared_memory(name)  # as Triton: an unknown name is no error


def test_unregister_all_over_grpc(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    unique: str,
) -> None:
    key = f"/all_{unique}"
    with shm_object(key, 4096):
        triton_grpc.register_system_shared_memory(f"a_{unique}", key, 4096)
        triton_grpc.register_system_shared_memory(f"b_{unique}", key, 1024, offset=1024)
        assert len(triton_grpc.get_system_shared_memory_status().regions) >= 2
        triton_grpc.unregister_system_shared_memory()
        assert triton_http.get_system_shared_memory_status() == []


# --- errors ------------------------------------------------------------------------------------


def test_an_unknown_region_is_not_found(
    triton_http: httpclient.InferenceServerClient, triton_grpc: grpcclient.InferenceServerClient
) -> None:
    error = raises(lambda: http_shm_infer(triton_http, "no_such_region", None))
    assert error.status() == "404"
    assert "Unable to find shared memory region: 'no_such_region'" in error.message()
    grpc_error = raises(lambda: grpc_shm_infer(triton_grpc, "no_such_region", None))
    assert grpc_error.status() == str(grpc.StatusCode.NOT_FOUND)


def test_an_offset_and_size_past_the_region_are_refused(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    unique: str,
) -> None:
    name, key = f"small_{unique}", f"/small_{unique}"
    with shm_object(key, INPUT_BYTES):
        triton_http.register_system_shared_memory(name, key, INPUT_BYTES - 4)
        try:
            error = raises(lambda: http_shm_infer(triton_http, name, None))
            assert error.status() == "400"
            assert f"Invalid offset + byte size for shared memory region: '{name}'" in str(error)
            grpc_error = raises(lambda: grpc_shm_infer(triton_grpc, name, None))
            assert grpc_error.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
            # A window past the end of the object is refused at registration.
            past = raises(
                lambda: triton_http.register_system_shared_memory(
                    "past", key, 64, offset=INPUT_BYTES
                )
            )
            assert "failed to register shared memory region 'past': invalid args" in str(past)
        finally:
            triton_http.unregister_system_shared_memory(name)


def test_an_output_region_too_small_for_the_output_is_refused(
    triton_http: httpclient.InferenceServerClient, unique: str
) -> None:
    x = rows(6)
    with registered_pair(triton_http, unique, x) as (inp, out, _):
        tensor = httpclient.InferInput("INPUT0", [ROWS, 64], "FP32")
        tensor.set_shared_memory(inp, INPUT_BYTES)
        output = httpclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(out, OUTPUT_BYTES - 4)
        error = raises(lambda: triton_http.infer("tiny_mlp", [tensor], outputs=[output]))
        assert f"({OUTPUT_BYTES - 4} bytes) should be at least {OUTPUT_BYTES} bytes" in str(error)


@pytest.mark.parametrize("key", ["/../etc/passwd", "../etc/passwd", "/a/b", "/..", "", "//x"])
def test_a_key_that_is_not_a_shm_name_is_refused(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    key: str,
) -> None:
    error = raises(lambda: triton_http.register_system_shared_memory("bad_key", key, 16))
    assert error.status() == "400"
    assert "is not a POSIX shared-memory name" in str(error)
    grpc_error = raises(lambda: triton_grpc.register_system_shared_memory("bad_key", key, 16))
    assert grpc_error.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert all(r["name"] != "bad_key" for r in triton_http.get_system_shared_memory_status())


def test_a_key_with_no_shm_object_is_refused(triton_http: httpclient.InferenceServerClient) -> None:
    error = raises(
        lambda: triton_http.register_system_shared_memory("absent", "/weir_absent_key", 16)
    )
    assert "Unable to open shared memory region: '/weir_absent_key'" in str(error)


def test_registering_a_name_twice_is_an_error(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    unique: str,
) -> None:
    name, key = f"twice_{unique}", f"/twice_{unique}"
    with shm_object(key, 1024):
        triton_http.register_system_shared_memory(name, key, 1024)
        try:
            error = raises(lambda: triton_http.register_system_shared_memory(name, key, 512))
            assert error.status() == "400"
            assert f"shared memory region '{name}' already in manager" in str(error)
            grpc_error = raises(lambda: triton_grpc.register_system_shared_memory(name, key, 512))
            assert grpc_error.status() == str(grpc.StatusCode.ALREADY_EXISTS)
        finally:
            triton_http.unregister_system_shared_memory(name)


def test_a_region_whose_object_the_client_removed_is_a_clear_error(
    triton_http: httpclient.InferenceServerClient,
    triton_grpc: grpcclient.InferenceServerClient,
    unique: str,
) -> None:
    name, key = f"gone_{unique}", f"/gone_{unique}"
    with shm_object(key, INPUT_BYTES) as handle:
        shm.set_shared_memory_region(handle, [rows(7)])
        triton_http.register_system_shared_memory(name, key, INPUT_BYTES)
        shm.destroy_shared_memory_region(handle)  # unmapped and unlinked by the client
    try:
        error = raises(lambda: http_shm_infer(triton_http, name, None))
        assert error.status() == "400"
        assert f"shared memory region '{name}': its object '{key}' was removed" in str(error)
        grpc_error = raises(lambda: grpc_shm_infer(triton_grpc, name, None))
        assert "was removed" in str(grpc_error)
    finally:
        triton_http.unregister_system_shared_memory(name)


def test_a_region_whose_object_shrank_is_a_clear_error(
    triton_http: httpclient.InferenceServerClient, unique: str
) -> None:
    name, key = f"shrunk_{unique}", f"/shrunk_{unique}"
    with shm_object(key, INPUT_BYTES):
        triton_http.register_system_shared_memory(name, key, INPUT_BYTES)
        try:
            os.truncate(f"/dev/shm/{key[1:]}", 16)
            error = raises(lambda: http_shm_infer(triton_http, name, None))
            assert error.status() == "400"
            assert f"its object '{key}' shrank to 16 bytes" in str(error)
            assert triton_http.is_server_live()  # no mapped page past the end was touched
        finally:
            triton_http.unregister_system_shared_memory(name)


def test_cuda_shared_memory_is_unavailable_with_a_reason(
    mesh: Mesh, triton_grpc: grpcclient.InferenceServerClient
) -> None:
    response = httpx.get(f"{mesh.url}/v2/cudasharedmemory/status", timeout=10)
    assert response.status_code == 503
    assert "CUDA shared memory" in response.json()["error"]
    error = raises(triton_grpc.get_cuda_shared_memory_status)
    assert error.status() == str(grpc.StatusCode.UNAVAILABLE)
    assert "CUDA shared memory" in str(error)


def test_server_metadata_names_the_extension(triton_http: httpclient.InferenceServerClient) -> None:
    assert "system_shared_memory" in triton_http.get_server_metadata()["extensions"]


def test_the_registry_holds_to_its_limits(unique: str) -> None:
    from gateway.shared_memory import RegionLimit, SharedMemoryRegistry

    key = f"/limit_{unique}"
    with shm_object(key, 4096):
        registry = SharedMemoryRegistry(max_regions=1, max_region_bytes=2048)
        try:
            with pytest.raises(RegionLimit, match="SHARED_MEMORY_MAX_REGION_BYTES"):
                registry.register("big", key, 0, 4096)
            registry.register("one", key, 0, 2048)
            with pytest.raises(RegionLimit, match="SHARED_MEMORY_MAX_REGIONS is 1"):
                registry.register("two", key, 2048, 1024)
        finally:
            registry.close()
        assert registry.status(None) == []


def test_a_region_unregistered_while_another_thread_reads_it_is_refused_as_unregistered(
    unique: str,
) -> None:
    """A large body's tensors are read in the parse thread; the event loop may unregister the
    region meanwhile. Each read gets the region's bytes or NotFound, never a closed mapping's
    ValueError (a 500) or a stat of a descriptor already closed and reused."""
    from gateway.shared_memory import SharedMemoryRegistry
    from weir.errors import NotFound

    key, size = f"/race_{unique}", 1 << 16
    data = np.arange(size // 4, dtype=np.float32)
    outcomes: list[str] = []

    def reader(region: Any, go: threading.Event) -> None:
        go.set()
        for _ in range(200):
            try:
                got = region.read(0, size)
                outcomes.append("read" if got == data.tobytes() else "wrong bytes")
            except NotFound:
                outcomes.append("unregistered")
            except Exception as exc:  # what the lock must rule out
                outcomes.append(repr(exc))

    with shm_object(key, size) as handle:
        shm.set_shared_memory_region(handle, [data])
        registry = SharedMemoryRegistry(max_regions=1, max_region_bytes=size)
        for _ in range(100):
            registry.register("racy", key, 0, size)
            go = threading.Event()
            thread = threading.Thread(target=reader, args=(registry.regions["racy"], go))
            thread.start()
            go.wait()
            registry.unregister("racy")
            thread.join()
    assert set(outcomes) == {"read", "unregistered"}, sorted(set(outcomes))
