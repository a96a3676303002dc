"""Triton's response cache: a request answered before is answered again without the model.

The unit tests hold the cache's own rules (the key, bytes, least recently used first out,
Triton's ``--cache-config``); the last runs ``weir up`` with a model that counts its calls,
so an answer from the cache shows as an old count, and reads the statistics and metrics
that Triton's clients read.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient

from gateway.response_cache import ENTRY_OVERHEAD_BYTES, ResponseCache, request_key
from tests.conftest import free_port, wait_until
from tests.weir_up import weir_up
from weir.cache_settings import cache_options
from weir.errors import ConfigError
from weir.redis_server import RedisServer
from weir.tensors import Tensor


def tensor(*values: float) -> Tensor:
    return Tensor.from_numpy(np.array([values], np.float32))


def key(inputs: dict[str, Tensor], outputs: list[str] = [], **parameters: object) -> bytes:  # noqa: B006
    return request_key("m", "1", inputs, outputs, parameters)


def test_the_key_is_the_model_its_inputs_outputs_and_parameters() -> None:
    base = key({"A": tensor(1, 2), "B": tensor(3)})
    assert key({"B": tensor(3), "A": tensor(1, 2)}) == base  # input order does not matter
    assert key({"A": tensor(1, 2), "B": tensor(4)}) != base
    assert key({"A": tensor(1, 2), "B": tensor(3)}, ["OUT"]) != base
    assert key({"A": tensor(1, 2), "B": tensor(3)}, scale=2) != base
    reshaped = Tensor("FP32", (2, 1), tensor(1, 2).data)
    assert key({"A": reshaped, "B": tensor(3)}) != base
    other = request_key("m", "2", {"A": tensor(1, 2), "B": tensor(3)}, [], {})
    assert other != base


def test_the_least_recently_used_answer_leaves_first() -> None:
    answer = {"OUT": Tensor("UINT8", (100,), bytes(100))}
    size = 2 * ENTRY_OVERHEAD_BYTES + 100
    cache = ResponseCache(3 * size)
    for name in (b"a", b"b", b"c"):
        cache.put(name, answer)
    assert cache.get(b"a") is not None  # a is now the most recently used
    cache.put(b"d", answer)
    assert cache.get(b"b") is None and len(cache) == 3
    assert all(cache.get(k) is not None for k in (b"a", b"c", b"d"))
    assert cache.used_bytes == 3 * size


def test_an_answer_larger_than_the_cache_is_not_kept() -> None:
    cache = ResponseCache(1000)
    cache.put(b"big", {"OUT": Tensor("UINT8", (1000,), bytes(1000))})
    assert cache.get(b"big") is None and cache.used_bytes == 0


def test_a_kept_answer_owns_its_bytes() -> None:
    buffer = bytearray(8)
    cache = ResponseCache(10_000)
    cache.put(b"k", {"OUT": Tensor("UINT8", (4,), memoryview(buffer)[:4])})  # type: ignore[arg-type]
    buffer[:4] = b"\x01\x02\x03\x04"
    kept = cache.get(b"k")
    assert kept is not None and kept["OUT"].data == bytes(4)


def test_tritons_cache_config_flag() -> None:
    assert cache_options(["local,size=1048576"]) == {"response_cache_bytes": 1048576}
    shared = cache_options(["redis,host=cache", "redis,port=7000", "redis,password=p@ss"])
    assert shared == {"response_cache_redis_url": "redis://:p%40ss@cache:7000/0"}
    with pytest.raises(ConfigError, match="local,size=BYTES or redis"):
        cache_options(["local,size=lots"])
    with pytest.raises(ConfigError, match="not both"):
        cache_options(["local,size=1", "redis,host=cache"])
    with pytest.raises(ConfigError, match="give host"):
        cache_options(["redis,port=7000"])


CONFIG = """
    backend: python
    max_batch_size: 8
    input: [{name: X, data_type: TYPE_FP32, dims: [2]}]
    output: [{name: CALLS, data_type: TYPE_FP32, dims: [2]}]
"""
COUNTER = """
    class Counter:
        def initialize(self, context):
            self.calls = 0

        def inference(self, batch):
            self.calls += 1
            return {"CALLS": batch["X"] * 0 + self.calls}
"""


def test_a_repeated_request_is_answered_from_the_cache(tmp_path: Path) -> None:
    models = tmp_path / "models"
    cached = "response_cache: {enable: true}\n"
    wide = textwrap.dedent(CONFIG).replace("dims: [2]", "dims: [-1]") + cached
    for name, config in (
        ("cached", textwrap.dedent(CONFIG) + cached),
        ("plain", textwrap.dedent(CONFIG)),
        ("wide", wide),  # inputs over a MiB: their key is hashed in a thread
    ):
        (models / name / "1").mkdir(parents=True)
        (models / name / "config.yaml").write_text(config)
        (models / name / "1" / "model.py").write_text(textwrap.dedent(COUNTER))
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    args = ["--repository", str(models), "--http-port", str(http_port)]
    args += ["--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    args += ["--redis-port", str(free_port()), "--cache-config", "local,size=4194304"]

    def calls(client: httpx.Client, model: str, x: list[float]) -> float:
        shape = [1, len(x)]
        body = {"inputs": [{"name": "X", "shape": shape, "datatype": "FP32", "data": x}]}
        answer = client.post(f"/v2/models/{model}/infer", json=body)
        assert answer.status_code == 200, answer.text
        return float(answer.json()["outputs"][0]["data"][0])

    with weir_up(*args), httpx.Client(base_url=f"http://127.0.0.1:{http_port}") as client:
        assert calls(client, "cached", [1, 2]) == 1
        assert calls(client, "cached", [1, 2]) == 1  # from the cache: the model ran once
        assert calls(client, "cached", [3, 4]) == 2
        assert calls(client, "cached", [1, 2]) == 1
        assert [calls(client, "plain", [1, 2]) for _ in range(2)] == [1, 2]
        many = [0.5] * 300_000
        assert [calls(client, "wide", many) for _ in range(2)] == [1, 1]

        def cache_stats() -> dict[str, dict[str, int]]:
            stats = client.get("/v2/models/cached/stats").json()["model_stats"][0]
            return stats["inference_stats"]

        wait_until(lambda: cache_stats()["cache_hit"]["count"] == 2, 10, "the hits counted")
        stats = cache_stats()
        assert stats["cache_miss"]["count"] == 2 and stats["success"]["count"] == 4
        assert stats["queue"]["count"] == 2  # only the two misses were queued
        with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as triton:
            grpc_stats = triton.get_inference_statistics("cached", as_json=True)
            assert grpc_stats["model_stats"][0]["inference_stats"]["cache_hit"]["count"] == "2"
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 2.0' in metrics
        assert "# TYPE nv_cache_num_hits_per_model counter" in metrics
        assert 'nv_cache_num_hits_per_model{model="plain"' not in metrics


def test_a_cache_redis_is_shared_and_passed_by_when_it_fails(tmp_path: Path) -> None:
    (tmp_path / "models" / "cached" / "1").mkdir(parents=True)
    config = textwrap.dedent(CONFIG) + "response_cache: {enable: true}\n"
    (tmp_path / "models" / "cached" / "config.yaml").write_text(config)
    (tmp_path / "models" / "cached" / "1" / "model.py").write_text(textwrap.dedent(COUNTER))
    port = free_port()
    url = f"http://127.0.0.1:{port}/v2/models/cached/infer"
    body = {"inputs": [{"name": "X", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}

    def calls() -> float:
        """One request on a new connection: either gateway process may take it."""
        answer = httpx.post(url, json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        return float(answer.json()["outputs"][0]["data"][0])

    with RedisServer() as cache:
        args = ["--repository", str(tmp_path / "models"), "--http-port", str(port)]
        args += ["--grpc-port", "0", "--metrics-port", "0", "--redis-port", str(free_port())]
        args += ["--cache-config", "redis,host=127.0.0.1"]
        args += ["--cache-config", f"redis,port={cache.port}", "--gateway-processes", "2"]
        with weir_up(*args):
            assert [calls() for _ in range(6)] == [1.0] * 6  # the model ran once
            with redis.Redis.from_url(cache.url) as plain:
                assert len(plain.keys("weir:cache:*")) == 1
            cache.stop()
            assert [calls(), calls()] == [2.0, 3.0]  # the cache is away: the model answers
