"""Compressed infer bodies over real HTTP, both ways, as Triton reads and writes them.

tritonclient's ``request_compression_algorithm`` (``Content-Encoding``) and
``response_compression_algorithm`` (``Accept-Encoding``) work unmodified; the body limit
counts decoded bytes, so a compression bomb is a 413 that costs the gateway no more memory
than the limit; an unknown coding is a 415 naming the ones Weir reads.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from types import ModuleType

import httpx
import numpy as np
import orjson
import pytest
import torch
import tritonclient.http as httpclient

from tests.conftest import BODY_LIMIT_BYTES, Mesh
from tests.gateway.test_hostile_input import PeakRss

ALGORITHMS = [None, "gzip", "deflate"]
INFER = "/v2/models/tiny_mlp/infer"


def tiny_input(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64), dtype=np.float32)


def tiny_reference(build_models: ModuleType, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_models.reference_module("tiny_mlp")(torch.from_numpy(x)).numpy()


def json_body(x: np.ndarray, padding: int = 0) -> bytes:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}
    body = orjson.dumps({"inputs": [tensor]})
    return body[:-1] + b" " * padding + body[-1:]  # whitespace before the last brace


@pytest.fixture
def client(mesh: Mesh) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=mesh.url, timeout=30) as http:
        yield http


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("response_algorithm", ALGORITHMS)
@pytest.mark.parametrize("request_algorithm", ALGORITHMS)
def test_tritonclient_compression_both_ways_gives_the_models_answer(
    mesh: Mesh,
    build_models: ModuleType,
    request_algorithm: str | None,
    response_algorithm: str | None,
    binary: bool,
) -> None:
    x = tiny_input(3, seed=7)
    client = httpclient.InferenceServerClient(mesh.url.removeprefix("http://"))
    try:
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
        result = client.infer(
            "tiny_mlp",
            [tensor],
            outputs=[wanted],
            request_compression_algorithm=request_algorithm,
            response_compression_algorithm=response_algorithm,
        )
    finally:
        client.close()
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT0"), tiny_reference(build_models, x), rtol=1e-4, atol=1e-5
    )


def raw_response(
    client: httpx.Client, content: bytes, headers: dict[str, str]
) -> tuple[httpx.Response, bytes]:
    """The response and its body exactly as sent (httpx would decode it)."""
    with client.stream("POST", INFER, content=content, headers=headers) as response:
        return response, b"".join(response.iter_raw())


@pytest.mark.parametrize(
    ("coding", "decompress"), [("gzip", gzip.decompress), ("deflate", zlib.decompress)]
)
def test_a_binary_response_is_compressed_with_the_header_length_of_the_plain_json(
    client: httpx.Client,
    build_models: ModuleType,
    coding: str,
    decompress: Callable[[bytes], bytes],
) -> None:
    x = tiny_input(2, seed=8)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [2, 64],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    )
    headers = {"Inference-Header-Content-Length": str(len(header)), "Accept-Encoding": coding}
    response, sent = raw_response(client, header + x.tobytes(), headers)
    assert response.status_code == 200, sent[:300]
    assert response.headers["content-encoding"] == coding
    assert response.headers["content-type"] == "application/octet-stream"
    plain = decompress(sent)
    json_length = int(response.headers["inference-header-content-length"])
    (output,) = orjson.loads(plain[:json_length])["outputs"]
    assert output["parameters"]["binary_data_size"] == len(plain) - json_length == 2 * 16 * 4
    # tritonclient reads it from the compressed bytes and the two headers.
    result = httpclient.InferenceServerClient.parse_response_body(
        sent, header_length=json_length, content_encoding=coding
    )
    np.testing.assert_allclose(
        result.as_numpy("OUTPUT0"), tiny_reference(build_models, x), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip;q=0.5, deflate", "deflate"),
        ("deflate;q=0.2, gzip;q=0.9", "gzip"),
        ("gzip, deflate", "gzip"),  # a tie: the first listed
        ("br", None),
        ("gzip;q=0", None),
        ("identity, gzip;q=0.5", None),
        ("*", None),
    ],
)
def test_accept_encoding_picks_the_response_coding_as_triton_does(
    client: httpx.Client, accept: str, chosen: str | None
) -> None:
    response, sent = raw_response(
        client, json_body(tiny_input(1, seed=9)), {"Accept-Encoding": accept}
    )
    assert response.status_code == 200, sent[:300]
    assert response.headers.get("content-encoding") == chosen
    plain = {"gzip": gzip.decompress, "deflate": zlib.decompress}.get(chosen or "", bytes)(sent)
    assert orjson.loads(plain)["outputs"][0]["shape"] == [1, 16]


def test_an_unknown_content_encoding_is_a_415_naming_the_supported_ones(
    client: httpx.Client,
) -> None:
    response = client.post(INFER, content=b"\x1b\x00", headers={"Content-Encoding": "br"})
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert "Unsupported compression type 'br'" in error and "gzip, deflate" in error
    assert response.headers["accept-encoding"] == "gzip, deflate"


def test_identity_content_encoding_is_the_plain_body(
    client: httpx.Client, build_models: ModuleType
) -> None:
    x = tiny_input(1, seed=10)
    response = client.post(INFER, content=json_body(x), headers={"Content-Encoding": "identity"})
    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(1, 16)
    np.testing.assert_allclose(got, tiny_reference(build_models, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("coding", "content", "message"),
    [
        ("gzip", b"this is not gzip", "request body is not valid gzip data"),
        ("deflate", b"\x78\x9c\xff\xff\xff", "request body is not valid deflate data"),
        ("gzip", gzip.compress(b'{"inputs": []}')[:-6], "ends before the end of its gzip data"),
        ("gzip", b"", "ends before the end of its gzip data"),
        ("gzip", gzip.compress(b"{}") + b"trailing", "data after the end of its gzip data"),
    ],
    ids=["not-gzip", "not-deflate", "truncated", "empty", "trailing"],
)
def test_a_corrupt_compressed_body_is_a_400_naming_the_coding(
    client: httpx.Client, coding: str, content: bytes, message: str
) -> None:
    response = client.post(INFER, content=content, headers={"Content-Encoding": coding})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_the_body_limit_counts_decoded_bytes(
    client: httpx.Client, build_models: ModuleType, coding: str
) -> None:
    x = tiny_input(1, seed=11)
    compress = gzip.compress if coding == "gzip" else zlib.compress
    headers = {"Content-Encoding": coding}
    under = json_body(x, padding=BODY_LIMIT_BYTES - 4096)
    assert len(under) <= BODY_LIMIT_BYTES
    response = client.post(INFER, content=compress(under), headers=headers)
    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(1, 16)
    np.testing.assert_allclose(got, tiny_reference(build_models, x), rtol=1e-4, atol=1e-5)
    over = json_body(x, padding=BODY_LIMIT_BYTES)
    small = compress(over)
    assert len(small) < BODY_LIMIT_BYTES // 100  # only its decoded size is over the limit
    response = client.post(INFER, content=small, headers=headers)
    assert response.status_code == 413, response.text
    assert (
        f"exceeds the maximum allowed value of {BODY_LIMIT_BYTES} bytes" in response.json()["error"]
    )


def gzip_bomb(decoded_bytes: int) -> bytes:
    """A gzip body of ``decoded_bytes`` zeros, built without holding them."""
    # Run-length matching: as small as the default strategy's output, and quicker to make.
    encoder = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16, 9, zlib.Z_RLE)
    block = bytes(2**20)
    parts = [encoder.compress(block) for _ in range(decoded_bytes // len(block))]
    return b"".join(parts) + encoder.flush()


def test_a_compression_bomb_is_a_413_without_a_memory_spike(mesh: Mesh) -> None:
    bomb = gzip_bomb(2**28)  # 256 MiB of zeros in about 256 KiB: 128 times the limit
    assert len(bomb) < BODY_LIMIT_BYTES
    with httpx.Client(base_url=mesh.url, timeout=30) as client:
        client.post(INFER, content=gzip.compress(json_body(tiny_input(1, seed=12))))  # warm
        with PeakRss(mesh.processes["gateway"].pid) as rss:
            for _ in range(3):
                response = client.post(INFER, content=bomb, headers={"Content-Encoding": "gzip"})
                assert response.status_code == 413, response.text
                assert set(response.json()) == {"error"}
                assert "decompressed request body exceeds" in response.json()["error"]
        ok = client.post(INFER, content=json_body(tiny_input(1, seed=13)))
    assert ok.status_code == 200, ok.text
    # Decoding stops one byte past the limit: the gateway holds about the limit, not 256 MiB.
    assert rss.growth < 16 * BODY_LIMIT_BYTES, f"RSS grew by {rss.growth / 2**20:.1f} MiB"
