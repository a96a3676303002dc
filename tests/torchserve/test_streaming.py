"""A handler's streamed answer (``send_intermediate_predict_response``) through ``weir up``.

The archive's handler imports TorchServe's own ``send_intermediate_predict_response`` and
streams ``parts`` parts to each request before it returns its answer, as TorchServe's LLM
examples do. The body says how many parts, a gate file the handler waits for after its first
part ("-": none) and whether it fails after its parts. Waiting on the gate shows the first
part reaches the client while the handler still runs; the test opens the gate only once it
has read that part.
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import httpx

from gateway.torchserve.grpc_inference import SERVICE, PredictionResponse, PredictionsRequest
from tests.conftest import free_port
from tests.torchserve.archives import build_archive
from tests.torchserve.meshes import write_ts_config
from tests.weir_up import services, weir_up

STREAMER = """
import time
from pathlib import Path

from ts.handler_utils.utils import send_intermediate_predict_response


class Streamer:
    def initialize(self, context):
        pass

    def handle(self, data, context):
        bodies = [r.get("body") or r.get("data") for r in data]
        texts = [b if isinstance(b, str) else bytes(b).decode() for b in bodies]
        parts, gate, fail = texts[0].split()
        for i in range(int(parts)):
            for idx in context.request_ids:
                context.set_response_header(idx, "x-part", str(i))
            send_intermediate_predict_response(
                [f"part {i} of {t}\\n" for t in texts],
                context.request_ids,
                "Intermediate Prediction success",
                200,
                context,
            )
            if i == 0 and gate != "-":
                waited = time.monotonic() + 30
                while not Path(gate).exists() and time.monotonic() < waited:
                    time.sleep(0.01)
        if fail == "fail":
            raise RuntimeError("the handler gave up")
        return [f"end of {t}\\n" for t in texts]
"""


def serve(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = tmp_path / "model-store"
    build_archive(store, "streamer", STREAMER)
    config = write_ts_config(tmp_path, store)
    args = ["--ts-config", str(config.path), "--models", "streamer.mar", "--grpc-port", "0"]
    args += ["--metrics-port", "0", "--redis-port", str(free_port())]
    return config, weir_up(*args)


def test_parts_reach_the_client_as_the_handler_streams_them(tmp_path: Path) -> None:
    config, up = serve(tmp_path)
    gate = tmp_path / "gate"
    with up, httpx.Client(base_url=f"http://127.0.0.1:{config.http_port}", timeout=30) as client:
        body = f"3 {gate} ok"
        headers = {"content-type": "text/plain"}
        with client.stream("POST", "/predictions/streamer", content=body, headers=headers) as r:
            assert r.status_code == 200
            assert r.headers["transfer-encoding"] == "chunked"
            assert "content-length" not in r.headers
            assert r.headers["x-part"] == "0"  # the first part's headers answer the request
            chunks = r.iter_raw()
            first = next(chunks)  # the handler waits at its gate: only this part exists yet
            assert first == f"part 0 of {body}\n".encode()
            gate.touch()
            rest = b"".join(chunks)
        assert rest == "".join(f"part {i} of {body}\n" for i in (1, 2)).encode() + (
            f"end of {body}\n".encode()
        )

        # The same connection goes on: an answer streamed nothing is sent whole.
        whole = client.post("/predictions/streamer", content="0 - ok", headers=headers)
        assert whole.status_code == 200
        assert whole.text == "end of 0 - ok\n"
        assert whole.headers["content-length"] == str(len(whole.content))

        # A failure after the first part can only be told in the body: TorchServe's error.
        with client.stream("POST", "/predictions/streamer", content="2 - fail") as r:
            assert r.status_code == 200
            text = r.read().decode()
        assert text.startswith("part 0 of 2 - fail\npart 1 of 2 - fail\n{")
        error = httpx.Response(200, content=text.split("\n", 2)[2]).json()
        assert error["code"] == 503
        assert "the handler gave up" in error["message"]

        # The ASGI path (an escaped character in the target) streams the same.
        with client.stream("POST", "/predictions/%73treamer", content="2 - ok") as r:
            assert r.headers["transfer-encoding"] == "chunked"
            assert r.read() == b"part 0 of 2 - ok\npart 1 of 2 - ok\nend of 2 - ok\n"

        # An HTTP/1.0 client gets the parts unframed; the closed connection ends them.
        with socket.create_connection(("127.0.0.1", config.http_port), timeout=30) as raw:
            raw.sendall(b"POST /predictions/streamer HTTP/1.0\r\ncontent-length: 6\r\n\r\n2 - ok")
            received = b"".join(iter(lambda: raw.recv(65536), b""))
        head, _, streamed = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"transfer-encoding" not in head
        assert streamed == b"part 0 of 2 - ok\npart 1 of 2 - ok\nend of 2 - ok\n"

        # KServe v2's infer takes the answer only.
        element = {"name": "body", "shape": [1, 1], "datatype": "BYTES", "data": ["1 - ok"]}
        v2 = client.post("/v2/models/streamer/infer", json={"inputs": [element]})
        assert v2.status_code == 200, v2.text
        outputs = {o["name"]: o["data"] for o in v2.json()["outputs"]}
        assert outputs["response"] == ["end of 1 - ok\n"]


def test_a_stream_cut_by_a_dead_worker_goes_on_where_it_stopped(tmp_path: Path) -> None:
    # The worker dies after the first part; its batch runs again on the next worker, which
    # streams the first part again: the client gets each part once, and the answer.
    config, up = serve(tmp_path)
    gate = tmp_path / "gate"
    body = f"3 {gate} ok"
    with up as running, httpx.Client(timeout=30) as client:
        url = f"http://127.0.0.1:{config.http_port}/predictions/streamer"
        with client.stream("POST", url, content=body, headers={"content-type": "text/plain"}) as r:
            chunks = r.iter_raw()
            assert next(chunks) == f"part 0 of {body}\n".encode()
            (worker,) = services(running.process.pid, "worker")
            worker.kill()
            gate.touch()
            rest = b"".join(chunks)
    parts = "".join(f"part {i} of {body}\n" for i in (1, 2))
    assert rest == f"{parts}end of {body}\n".encode()


def test_grpc_stream_predictions_sends_each_part(tmp_path: Path) -> None:
    config, up = serve(tmp_path)
    with up, grpc.insecure_channel(f"127.0.0.1:{config.grpc_inference_port}") as channel:
        path = f"/{SERVICE}/StreamPredictions"
        request = PredictionsRequest(model_name="streamer", input={"body": b"2 - ok"})
        replies = channel.unary_stream(path)(request.SerializeToString(), timeout=30)
        messages = [PredictionResponse.FromString(r).prediction for r in replies]
        assert messages == [b"part 0 of 2 - ok\n", b"part 1 of 2 - ok\n", b"end of 2 - ok\n"]

        unary = channel.unary_unary(f"/{SERVICE}/Predictions")
        answer = PredictionResponse.FromString(unary(request.SerializeToString(), timeout=30))
        assert answer.prediction == b"end of 2 - ok\n"

        failing = PredictionsRequest(model_name="streamer", input={"body": b"1 - fail"})
        replies = channel.unary_stream(path)(failing.SerializeToString(), timeout=30)
        received = []
        try:
            for reply in replies:
                received.append(PredictionResponse.FromString(reply).prediction)
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE  # 503, as TorchServe maps it
            assert "the handler gave up" in (exc.details() or "")
        else:
            raise AssertionError("the failed stream ended without an error")
        assert received == [b"part 0 of 1 - fail\n"]
