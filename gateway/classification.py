"""Triton's classification extension: an output answered as its top-K classes.

An output requested with ``"parameters": {"classification": K}`` (tritonclient's
``class_count=K``) comes back as BYTES strings ``"value:index"``, or ``"value:index:label"``
where the output's ``label_filename`` (a file in the model directory, one label per line)
names the class, the K largest values first. A model that batches gets K per batch row,
shape ``[batch, K]``; one that does not, ``[K]``. K is capped at the number of values. The
value is written as Triton writes it (C's ``%f`` for floats, a whole number for integers).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from gateway.codec import InferBody
from weir import datatypes
from weir.errors import InvalidInput
from weir.repository import ModelEntry
from weir.tensors import Tensor

# Triton's cap on the values one classification output may rank.
MAX_CLASSIFIED_ELEMENTS = 1_000_000


def apply(entry: ModelEntry, body: InferBody, outputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """``outputs`` with each output the request asked to classify replaced by its classes."""
    wanted = [o for o in body.outputs if o.classification]
    if not wanted:
        return outputs
    classified = dict(outputs)
    for requested in wanted:
        labels = _labels(entry, requested.name)
        tensor = outputs[requested.name]
        classified[requested.name] = classify(
            tensor, requested.classification, entry.config.max_batch_size > 0, labels
        )
    return classified


def classify(tensor: Tensor, count: int, batched: bool, labels: tuple[str, ...]) -> Tensor:
    """The top ``count`` classes of ``tensor`` (per batch row when ``batched``) as BYTES."""
    if datatypes.element_size(tensor.datatype) is None or tensor.datatype == datatypes.BF16:
        raise InvalidInput(
            f"class result not available for output due to unsupported type '{tensor.datatype}'"
        )
    if tensor.element_count > MAX_CLASSIFIED_ELEMENTS:
        raise InvalidInput("classification output tensor too large")
    values = tensor.to_numpy()
    rows = values.reshape(values.shape[0], -1) if batched and values.ndim else values.reshape(1, -1)
    top = min(count, rows.shape[1])
    strings = [_row_classes(row, top, labels) for row in rows]
    shape = (rows.shape[0], top) if batched and values.ndim else (top,)
    return Tensor(
        datatypes.BYTES, shape, datatypes.serialize_bytes([s for r in strings for s in r])
    )


def _row_classes(row: np.ndarray, top: int, labels: tuple[str, ...]) -> list[bytes]:
    order = np.argsort(-row.astype(np.float64), kind="stable")[:top]
    floating = row.dtype.kind == "f"
    classes = []
    for index in order.tolist():
        value = row[index]
        text = f"{float(value):f}:{index}" if floating else f"{int(value)}:{index}"
        if index < len(labels):
            text += f":{labels[index]}"
        classes.append(text.encode())
    return classes


def _labels(entry: ModelEntry, output: str) -> tuple[str, ...]:
    spec = entry.config.output_spec(output)
    if spec is None or not spec.label_filename:
        return ()
    return read_labels(entry.path / spec.label_filename)


@functools.lru_cache(maxsize=256)
def read_labels(path: Path) -> tuple[str, ...]:
    """The labels of a ``label_filename``, one per line (read once per file)."""
    try:
        return tuple(path.read_text().splitlines())
    except OSError as exc:
        raise InvalidInput(f"cannot read the labels of {path.name}: {exc}") from None
