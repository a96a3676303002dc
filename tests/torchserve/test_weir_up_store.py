"""``weir up`` started as ``torchserve --start`` is: a model store, archives, config.properties."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import free_port, wait_until
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import weir_up

HANDLER = """
def handle(data, context):
    if data is None:
        return None
    context.metrics.add_counter("Greetings", len(data))
    return [
        {
            "got": bytes(row["body"]).decode(),
            "as": type(row["body"]).__name__,
            "model": context.model_name,
        }
        for row in data
    ]
"""


def test_weir_up_serves_a_model_store_as_torchserve_would(tmp_path: Path) -> None:
    store = tmp_path / "model-store"
    build_archive(store, "greeter", HANDLER)
    build_archive(store, "idle", HANDLER)
    config = write_ts_config(
        tmp_path,
        store,
        "load_models=idle.mar",
        "number_of_netty_threads=4",
        "decode_input_request=false",
        'models={"hello": {"1.0": {"marName": "greeter.mar", "batchSize": 4, '
        '"maxBatchDelay": 20, "startupTimeout": 45}}}',
    )
    http_port, management_port = config.http_port, config.management_port
    metrics_port = config.metrics_port
    args = ["--ts-config", str(config.path), "--models", "hello=greeter.mar", "--grpc-port", "0"]
    args += ["--redis-port", str(free_port())]
    with weir_up(*args) as up:
        announced = f"management http://127.0.0.1:{management_port}/models"
        wait_until(lambda: announced in "".join(up.lines), 10, "the TorchServe APIs' line")
        # decode_input_request=false: a JSON body reaches the handler as its bytes.
        answer = httpx.post(f"http://127.0.0.1:{http_port}/predictions/hello", json=[1], timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"got": "[1]", "as": "bytearray", "model": "hello"}
        listed = httpx.get(f"http://127.0.0.1:{management_port}/models").json()
        # --models wins over load_models, as torchserve's command line does
        assert listed == {"models": [{"modelName": "hello", "modelUrl": "greeter.mar"}]}
        (described,) = httpx.get(f"http://127.0.0.1:{management_port}/models/hello").json()
        assert (described["batchSize"], described["maxBatchDelay"]) == (4, 20)
        assert (described["responseTimeout"], described["startupTimeout"]) == (120, 45)
        assert described["loadedAtStartup"] is True

        # What the handler recorded, and TorchServe's PredictionTime, under their names.
        def scraped() -> list[str]:
            return httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text.splitlines()

        def greeted() -> bool:
            return any(line.startswith("Greetings{") for line in scraped())

        wait_until(greeted, 10, "the handler's metric on the metrics port")
        lines = scraped()
        (greetings,) = [line for line in lines if line.startswith("Greetings{")]
        assert 'Level="Model",ModelName="hello"' in greetings
        assert greetings.endswith(" 1.0")
        assert "# TYPE Greetings counter" in lines
        assert [line for line in lines if line.startswith("PredictionTime{")]
