"""Unit tests for running a batch on a backend (workers.execution.BatchRunner).

The backends here are small real implementations of ``ModelBackend`` that compute with numpy,
plus one real TorchBackend on a scripted module, so the batching logic runs end to end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from weir.config import ModelConfig
from weir.errors import InvalidInput, ServerError
from weir.tensors import Tensor
from weir.wire import InferReply, InferRequest
from workers.backends.base import ModelBackend
from workers.execution import BatchRunner

COMPUTE_STAMPS = {"compute_start", "compute_input_end", "compute_infer_end", "compute_end"}


def config(max_batch_size: int = 8, **overrides: Any) -> ModelConfig:
    raw: dict[str, Any] = {
        "name": "doubler",
        "backend": "pytorch",
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [
            {"name": "DOUBLED", "data_type": "TYPE_FP32", "dims": [-1]},
            {"name": "COUNT", "data_type": "TYPE_INT64", "dims": [1]},
        ],
    }
    raw.update(overrides)
    return ModelConfig.model_validate(raw)


class Doubler(ModelBackend):
    """Doubles INPUT0 and counts each row's elements; records the shape of every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["INPUT0"]
        self.calls.append(x.shape)
        rows = x.shape[0] if x.ndim > 1 else 1
        count = np.full((rows, 1), x.shape[-1], dtype=np.int64)
        return {"DOUBLED": x * 2, "COUNT": count if x.ndim > 1 else count[0]}


class DropsARow(Doubler):
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = super().infer(inputs)
        return {name: array[:-1] for name, array in outputs.items()}


class Fails(ModelBackend):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise self.error


class WrongDtype(Doubler):
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = super().infer(inputs)
        return {**outputs, "DOUBLED": outputs["DOUBLED"].astype(np.float64)}


class ForgetsCount(Doubler):
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"DOUBLED": super().infer(inputs)["DOUBLED"]}


def request(
    number: int, array: np.ndarray, outputs: list[str] | None = None, name: str = "INPUT0"
) -> InferRequest:
    return InferRequest(
        id=f"req-{number}",
        model="doubler",
        version="1",
        inputs={name: Tensor.from_numpy(array)},
        reply_to="weir:replies:gw",
        deadline_ms=2**42,  # year 2109: never past
        outputs=outputs or [],
        ts={"gateway_in": number},
    )


def rows(batch: int, width: int = 4, start: float = 0.0) -> np.ndarray:
    return (start + np.arange(batch * width, dtype=np.float32)).reshape(batch, width)


def assert_failed(reply: InferReply, kind: str, *fragments: str) -> None:
    assert reply.error is not None
    assert reply.error[0] == kind
    for fragment in fragments:
        assert fragment in reply.error[1]
    assert reply.outputs == {}


# --- batching and splitting -------------------------------------------------------------------


def test_outputs_are_split_back_per_request_in_order_with_their_own_batch_sizes() -> None:
    backend = Doubler()
    inputs = [rows(1, start=0), rows(3, start=100), rows(2, start=200)]
    requests = [request(i, x) for i, x in enumerate(inputs)]

    replies, executions = BatchRunner(config(), backend).run(requests)

    assert backend.calls == [(6, 4)]
    assert executions == [6]
    assert [r.id for r in replies] == ["req-0", "req-1", "req-2"]
    for reply, x in zip(replies, inputs, strict=True):
        assert reply.error is None
        assert set(reply.outputs) == {"DOUBLED", "COUNT"}
        doubled = reply.outputs["DOUBLED"].to_numpy()
        assert doubled.shape == x.shape
        assert np.array_equal(doubled, x * 2)
        assert reply.outputs["COUNT"].shape == (x.shape[0], 1)
        assert reply.outputs["DOUBLED"].datatype == "FP32"
        assert reply.outputs["COUNT"].datatype == "INT64"


def test_reply_keeps_request_stamps_and_adds_compute_stamps() -> None:
    replies, _ = BatchRunner(config(), Doubler()).run([request(7, rows(1))])
    stamps = replies[0].ts
    assert stamps["gateway_in"] == 7
    assert set(stamps) >= COMPUTE_STAMPS
    assert (
        stamps["compute_start"]
        <= stamps["compute_input_end"]
        <= stamps["compute_infer_end"]
        <= stamps["compute_end"]
    )


def test_members_with_different_variable_dims_run_as_separate_calls() -> None:
    backend = Doubler()
    inputs = [rows(1, width=4), rows(2, width=4), rows(1, width=6), rows(3, width=4)]

    replies, executions = BatchRunner(config(), backend).run(
        [request(i, x) for i, x in enumerate(inputs)]
    )

    # Runs of equal shapes share a call; order is kept, so the last width-4 member runs alone.
    assert backend.calls == [(3, 4), (1, 6), (3, 4)]
    assert executions == [3, 1, 3]
    assert [r.id for r in replies] == ["req-0", "req-1", "req-2", "req-3"]
    for reply, x in zip(replies, inputs, strict=True):
        assert np.array_equal(reply.outputs["DOUBLED"].to_numpy(), x * 2)
        assert reply.outputs["COUNT"].to_numpy()[:, 0].tolist() == [x.shape[1]] * x.shape[0]


def test_requested_output_subset_is_respected_per_request() -> None:
    requests = [
        request(0, rows(1), outputs=["COUNT"]),
        request(1, rows(2), outputs=["DOUBLED"]),
        request(2, rows(1)),
    ]

    replies, _ = BatchRunner(config(), Doubler()).run(requests)

    assert [sorted(r.outputs) for r in replies] == [["COUNT"], ["DOUBLED"], ["COUNT", "DOUBLED"]]
    assert replies[0].outputs["COUNT"].to_numpy().tolist() == [[4]]


def test_unbatched_model_gets_the_request_without_a_batch_dim() -> None:
    backend = Doubler()
    x = np.array([1.5, -2.0, 3.0], dtype=np.float32)

    replies, executions = BatchRunner(config(max_batch_size=0), backend).run([request(0, x)])

    assert backend.calls == [(3,)]
    assert executions == [1]
    assert np.array_equal(replies[0].outputs["DOUBLED"].to_numpy(), x * 2)


def test_backend_receives_a_writable_array() -> None:
    seen: list[bool] = []

    class Inspects(Doubler):
        def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            seen.append(inputs["INPUT0"].flags.writeable)
            return super().infer(inputs)

    BatchRunner(config(), Inspects()).run([request(0, rows(1))])
    BatchRunner(config(max_batch_size=0), Inspects()).run([request(0, rows(1)[0])])
    assert seen == [True, True]


# --- failures ---------------------------------------------------------------------------------


def test_wrong_number_of_output_rows_fails_every_member_with_internal_error() -> None:
    requests = [request(0, rows(1)), request(1, rows(3)), request(2, rows(2))]

    replies, executions = BatchRunner(config(), DropsARow(), isolation_runs=0).run(requests)

    assert executions == [6]
    assert [r.id for r in replies] == ["req-0", "req-1", "req-2"]
    for reply in replies:
        assert_failed(reply, "internal", "model 'doubler'", "for a batch of 6")
        with pytest.raises(ServerError):
            reply.raise_for_error()


def test_scalar_output_for_a_batching_model_fails_the_members() -> None:
    class Scalar(ModelBackend):
        def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {"DOUBLED": np.zeros((), np.float32), "COUNT": np.zeros((), np.int64)}

    replies, _ = BatchRunner(config(), Scalar()).run([request(0, rows(1))])
    assert_failed(replies[0], "internal", "model 'doubler'", "one output row per input row")


def test_backend_exception_fails_each_member_naming_model_and_error() -> None:
    requests = [request(0, rows(1)), request(1, rows(2))]

    runner = BatchRunner(config(), Fails(RuntimeError("device lost")), isolation_runs=0)
    replies, executions = runner.run(requests)

    assert executions == [3]
    assert len(replies) == 2
    for reply in replies:
        assert_failed(reply, "internal", "model 'doubler' failed", "RuntimeError", "device lost")


def test_backend_weir_error_keeps_its_kind() -> None:
    replies, _ = BatchRunner(config(), Fails(InvalidInput("bad pixels"))).run([request(0, rows(1))])
    assert_failed(replies[0], "invalid", "bad pixels")
    with pytest.raises(InvalidInput):
        replies[0].raise_for_error()


def test_failing_call_does_not_fail_members_of_other_calls() -> None:
    class FailsOnWidth6(Doubler):
        def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            if inputs["INPUT0"].shape[-1] == 6:
                raise ValueError("width 6 unsupported")
            return super().infer(inputs)

    requests = [request(0, rows(1, 4)), request(1, rows(1, 6)), request(2, rows(2, 5))]

    replies, executions = BatchRunner(config(), FailsOnWidth6()).run(requests)

    assert executions == [1, 1, 2]
    assert replies[0].error is None
    assert_failed(replies[1], "internal", "width 6 unsupported")
    assert replies[2].error is None


def test_output_dtype_mismatch_is_reported_naming_output_and_types() -> None:
    replies, _ = BatchRunner(config(), WrongDtype()).run([request(0, rows(2))])
    assert_failed(replies[0], "internal", "model 'doubler'", "DOUBLED", "FP64", "FP32")


def test_output_missing_from_backend_result_fails_the_members() -> None:
    replies, _ = BatchRunner(config(), ForgetsCount()).run([request(0, rows(1))])
    assert_failed(replies[0], "internal", "model 'doubler' failed", "COUNT")


def test_missing_output_not_requested_does_not_fail_the_request() -> None:
    replies, _ = BatchRunner(config(), ForgetsCount()).run(
        [request(0, rows(1), outputs=["DOUBLED"])]
    )
    assert replies[0].error is None
    assert list(replies[0].outputs) == ["DOUBLED"]


def test_request_omitting_an_optional_input_gets_a_reply() -> None:
    optional = config(
        input=[
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]},
            {"name": "EXTRA", "data_type": "TYPE_FP32", "dims": [-1], "optional": True},
        ]
    )

    replies, _ = BatchRunner(optional, Doubler()).run([request(0, rows(1))])

    assert [r.id for r in replies] == ["req-0"]


# --- a real TorchBackend ----------------------------------------------------------------------


class TimesTwoPlusOne(torch.nn.Module):
    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:  # arg named as the config input
        return INPUT0 * 2 + 1


# TorchScript is deprecated in this torch; the deprecation is not what these tests are about.
@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.(script|load)` is deprecated:DeprecationWarning")
def test_torchscript_backend_runs_a_batch_and_splits_it(tmp_path: Path) -> None:
    from workers.backends.torch_backend import TorchBackend

    version_dir = tmp_path / "1"
    version_dir.mkdir()
    torch.jit.script(TimesTwoPlusOne()).save(str(version_dir / "model.pt"))
    torch_config = config(
        name="scripted",
        input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [3]}],
    )
    runner = BatchRunner(torch_config, TorchBackend(torch_config, version_dir))
    inputs = [rows(1, 3), rows(3, 3, start=10), rows(2, 3, start=-5)]

    replies, executions = runner.run([request(i, x) for i, x in enumerate(inputs)])

    assert executions == [6]
    for reply, x in zip(replies, inputs, strict=True):
        assert reply.error is None, reply.error
        out = reply.outputs["OUTPUT0"]
        assert out.datatype == "FP32"
        assert np.array_equal(out.to_numpy(), x * 2 + 1)


# --- a failed batch finds its failing requests ----------------------------------------------


class Embeds(torch.nn.Module):
    """TorchScript's embedding lookup: an index past the table raises inside the model."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 2)

    def forward(self, INPUT0: torch.Tensor) -> torch.Tensor:
        return self.table(INPUT0)


def embedding_runner(tmp_path: Path, isolation_runs: int = 16) -> BatchRunner:
    from workers.backends import load_backend

    torch.jit.script(Embeds()).save(str(tmp_path / "model.pt"))
    embeds = ModelConfig.model_validate(
        {
            "name": "embeds",
            "backend": "pytorch",
            "max_batch_size": 16,
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT64", "dims": [1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1, 2]}],
        }
    )
    return BatchRunner(embeds, load_backend(embeds, tmp_path), isolation_runs)


def token_requests(tokens: list[int]) -> list[InferRequest]:
    return [request(i, np.array([[t]], dtype=np.int64)) for i, t in enumerate(tokens)]


def test_one_bad_request_fails_alone_and_its_batch_mates_are_answered(tmp_path: Path) -> None:
    runner = embedding_runner(tmp_path)
    tokens = [1, 2, 3, 4, 99, 5, 6, 7, 8, 9, 0, 1]  # 99 is past the 10-row table

    replies, executions = runner.run_batch(token_requests(tokens))

    assert [r.id for r in replies] == [f"req-{i}" for i in range(len(tokens))]
    failed = [i for i, r in enumerate(replies) if r.error is not None]
    assert failed == [4]
    succeeded = [e.batch_size for e in executions if e.phases_ns is not None]
    assert sum(succeeded) == len(tokens) - 1  # every valid row ran once, in some half
    assert len(executions) <= 1 + 16  # the failed whole, then at most the budget
    for i, reply in enumerate(replies):
        if i != 4:
            assert reply.outputs["OUTPUT0"].shape == (1, 1, 2)


def test_a_failure_reply_carries_no_traceback_or_serialized_code(tmp_path: Path) -> None:
    runner = embedding_runner(tmp_path)
    (reply,) = runner.run(token_requests([42]))[0]

    assert reply.error is not None
    message = reply.error[1]
    assert message.startswith("model 'embeds' failed: ")
    assert "index out of range" in message
    assert "Traceback" not in message and "serialized code" not in message
    assert str(tmp_path) not in message and ".py" not in message
    assert len(message) < 400


def test_isolation_stops_at_its_budget(tmp_path: Path) -> None:
    runner = embedding_runner(tmp_path, isolation_runs=2)
    tokens = [1, 2, 3, 99, 4, 5, 6, 7]

    replies, executions = runner.run(token_requests(tokens))

    # One split: the half without the bad token is answered, the other fails whole.
    assert len(executions) == 3
    assert [r.error is None for r in replies] == [False] * 4 + [True] * 4


def test_no_isolation_fails_the_whole_batch(tmp_path: Path) -> None:
    replies, executions = embedding_runner(tmp_path, isolation_runs=0).run(
        token_requests([1, 99, 2])
    )
    assert executions == [3]
    assert all(r.error is not None for r in replies)
