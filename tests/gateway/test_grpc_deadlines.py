"""A client's gRPC deadline is the client's: when it passes, gRPC's own DEADLINE_EXCEEDED wins.

As with Triton, a call whose deadline passes ends with the status and text the client's gRPC
library gives it ("Deadline Exceeded"), never sooner and never with the server's own text;
the mesh drops the request a grace later. One mesh on its own redis-server serves a Python
model that sleeps, with one instance, so a second request waits in the batcher's queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import Mesh, private_mesh
from tests.sleeper import write_sleeper

SLEEP_S = 1.5
GRPC_TEXT = "Deadline Exceeded"  # what grpc's own deadline reports, as a Triton client sees it

HANDLER = """
import time


class Sleeps:
    def initialize(self, context):
        self.sleep_s = float(context.parameters["sleep_s"])

    def preprocess(self, batch):
        return batch["X"]

    def inference(self, x):
        time.sleep(self.sleep_s)
        return x

    def postprocess(self, x):
        return {"Y": x}
"""


def write_model(repository: Path) -> None:
    write_sleeper(repository, HANDLER, parameters={"sleep_s": str(SLEEP_S)})


@pytest.fixture(scope="module")
def sleeper_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    repository = tmp_path_factory.mktemp("deadlines") / "models"
    write_model(repository)
    with private_mesh(repository) as running:
        yield running


@pytest.fixture
def client(sleeper_mesh: Mesh) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(sleeper_mesh.grpc_target)
    yield triton
    triton.close()


def x_input(value: float) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("X", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
    return tensor


def timed_out(client: grpcclient.InferenceServerClient, client_timeout_s: float) -> float:
    """Infer with a client deadline that passes first; the error must be gRPC's own."""
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as caught:
        client.infer("sleeper", [x_input(1.0)], client_timeout=client_timeout_s)
    elapsed = time.monotonic() - started
    assert caught.value.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED), caught.value
    assert caught.value.message() == GRPC_TEXT
    return elapsed


@pytest.mark.parametrize("client_timeout_s", [0.05, 0.2, 0.6])
def test_a_run_longer_than_the_deadline_gets_the_clients_deadline_exceeded(
    client: grpcclient.InferenceServerClient, client_timeout_s: float
) -> None:
    assert timed_out(client, client_timeout_s) >= client_timeout_s


def test_a_request_queued_past_its_deadline_gets_the_clients_deadline_exceeded(
    sleeper_mesh: Mesh, client: grpcclient.InferenceServerClient
) -> None:
    # One request keeps the only instance busy; the next waits in the batcher's queue, whose
    # expiry would answer with the server's own text if the mesh's deadline were the client's.
    busy = grpcclient.InferenceServerClient(sleeper_mesh.grpc_target)
    first = threading.Thread(target=lambda: busy.infer("sleeper", [x_input(0.0)]))
    first.start()
    try:
        for client_timeout_s in (0.1, 0.3):
            assert timed_out(client, client_timeout_s) >= client_timeout_s
    finally:
        first.join(30)
        busy.close()


def test_a_deadline_longer_than_the_run_is_answered(
    client: grpcclient.InferenceServerClient,
) -> None:
    result = client.infer("sleeper", [x_input(2.5)], client_timeout=SLEEP_S + 30)
    np.testing.assert_array_equal(result.as_numpy("Y"), np.full((1, 1), 2.5, np.float32))
