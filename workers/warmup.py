"""Warm-up: a model instance runs its config's ``model_warmup`` samples before it serves.

The first batches through a runtime pay for what it initialises lazily (allocator pools,
kernel selection, TorchScript's profiling runs, a handler's caches); a warm-up pays that at
start-up instead of in the first requests' latency. Each sample runs as one request of
``batch_size`` rows through :meth:`BatchRunner.run_batch`, the path real batches take, so
it exercises the same concatenation, backend call and output checks. Each row holds the same
data, as in Triton, where the sample's inputs are duplicated to the batch size.

Data per input, as ``model_config.proto`` defines it: ``zero_data`` (zeros; empty strings
for BYTES), ``random_data`` (seeded values of the datatype: small integers, floats in
[0, 1), random bools, short ASCII byte strings) or ``input_data_file`` (one row's raw bytes
from ``<model dir>/warmup/<file>``; Triton's length-prefixed elements for BYTES). A sample
that fails stops the load with :class:`WarmupError`, as Triton refuses to load a model whose
warm-up fails: an instance that cannot run its own sample should not take traffic.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np

from weir import datatypes
from weir.config import ModelConfig
from weir.config_warmup import WARMUP_FOLDER, ModelWarmup, WarmupInput
from weir.errors import ConfigError, InvalidInput, WeirError
from weir.tensors import Tensor
from weir.wire import InferRequest
from workers.execution import BatchRunner

logger = logging.getLogger(__name__)

RANDOM_SEED = 0  # random_data is reproducible: a failing warm-up fails the same way again
RANDOM_INT_HIGH = 100  # random integers are in [0, 100): valid in every integer type
RANDOM_BYTES_CHARS = 8  # random BYTES elements are 1 to 8 ASCII letters and digits
_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", "u1")


class WarmupError(ConfigError):
    """A warm-up sample failed: the model instance is not fit to serve.

    A :class:`ConfigError`, so a worker's start-up stops on it as on any other load error.
    """

    def __init__(self, model: str, sample: str, reason: str) -> None:
        super().__init__(f"model '{model}' warm-up '{sample}' failed: {reason}")
        self.model = model
        self.sample = sample
        self.reason = reason


def run_warmup(config: ModelConfig, runner: BatchRunner, model_dir: Path) -> None:
    """Run every ``model_warmup`` sample of ``config`` on ``runner``'s instance.

    ``model_dir``: the model's directory (the one holding ``config.yaml`` and the version
    directories), whose ``warmup/`` folder holds the ``input_data_file`` files. Blocks while
    the backend runs: call it from an instance thread, before the instance takes work.
    Raises :class:`WarmupError` naming the model, the sample and the reason.
    """
    if not config.model_warmup:
        return
    started = time.monotonic()
    runs = sum(_run_sample(config, runner, model_dir, sample) for sample in config.model_warmup)
    logger.info(
        "model %s warmed up: %d samples, %d runs in %.3f s",
        config.name,
        len(config.model_warmup),
        runs,
        time.monotonic() - started,
    )


def _run_sample(
    config: ModelConfig, runner: BatchRunner, model_dir: Path, sample: ModelWarmup
) -> int:
    """Run one sample ``sample.runs`` times; how many runs it made."""
    if sample.batch_size == 0:
        logger.warning(
            "model %s warm-up %r has batch_size 0 and is skipped, as Triton skips it",
            config.name,
            sample.name,
        )
        return 0
    try:
        request = sample_request(config, sample, model_dir)
        for _ in range(sample.runs):
            (reply,), _ = runner.run_batch([request])
            reply.raise_for_error()
    except Exception as exc:
        raise WarmupError(config.name, sample.name, _reason(exc)) from exc
    return sample.runs


def _reason(exc: Exception) -> str:
    if isinstance(exc, WeirError):  # a failed reply: already names the model and the cause
        return exc.message
    if isinstance(exc, ValueError):  # the sample's data: names the file and the problem
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def sample_request(config: ModelConfig, sample: ModelWarmup, model_dir: Path) -> InferRequest:
    """The request a sample runs as: each input's row repeated ``batch_size`` times."""
    rng = np.random.default_rng(RANDOM_SEED)
    inputs = {
        name: _tensor(config, sample, given, row_bytes(given, model_dir, rng))
        for name, given in sample.inputs.items()
    }
    return InferRequest(f"warmup-{sample.name}", config.name, "", inputs, "", 0)


def _tensor(config: ModelConfig, sample: ModelWarmup, given: WarmupInput, row: bytes) -> Tensor:
    if config.max_batch_size > 0:
        shape = (sample.batch_size, *given.dims)
        return Tensor(given.data_type, shape, row * sample.batch_size)
    return Tensor(given.data_type, given.dims, row)


def row_bytes(given: WarmupInput, model_dir: Path, rng: np.random.Generator) -> bytes:
    """One row of an input's data, as the wire carries it (little-endian, BYTES framed)."""
    count = math.prod(given.dims)
    if given.input_data_file:
        return _file_row(given, model_dir / WARMUP_FOLDER / given.input_data_file, count)
    if given.random_data:
        return _random_row(given.data_type, count, rng)
    if given.data_type == datatypes.BYTES:
        return datatypes.serialize_bytes([b""] * count)
    return bytes(count * (datatypes.element_size(given.data_type) or 0))


def _file_row(given: WarmupInput, path: Path, count: int) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if given.data_type == datatypes.BYTES:
        try:
            datatypes.deserialize_bytes(data, count)
        except InvalidInput as exc:
            raise ValueError(f"{path}: {exc.message}") from None
        return data
    needed = count * (datatypes.element_size(given.data_type) or 0)
    if len(data) < needed:
        raise ValueError(
            f"{path} holds {len(data)} bytes; {given.data_type} {list(given.dims)} needs {needed}"
        )
    return data[:needed]  # Triton reads the first bytes of a longer file too


def _random_row(datatype: str, count: int, rng: np.random.Generator) -> bytes:
    if datatype == datatypes.BYTES:
        return datatypes.serialize_bytes(_random_strings(count, rng))
    if datatype == datatypes.BF16:
        # BF16 is the high half of an FP32 word.
        words = rng.random(count, dtype=np.float32).view("<u4") >> 16
        return words.astype("<u2").tobytes()
    dtype = datatypes.numpy_dtype(datatype)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype).tobytes()
    if dtype.kind == "f":
        return rng.random(count).astype(dtype).tobytes()
    return rng.integers(0, RANDOM_INT_HIGH, count).astype(dtype).tobytes()


def _random_strings(count: int, rng: np.random.Generator) -> list[bytes]:
    # ASCII letters and digits: valid UTF-8, so a handler that decodes text accepts them.
    lengths = rng.integers(1, RANDOM_BYTES_CHARS + 1, count)
    return [_ALPHABET[rng.integers(0, len(_ALPHABET), n)].tobytes() for n in lengths]
