"""Mean pooling and L2 normalisation, as sentence-transformers does for all-MiniLM-L6-v2.

token_embeddings FP32 [batch, 128, 384] and attention_mask INT64 [batch, 128] ->
embedding FP32 [batch, 384]: the mean of the embeddings of the real (unpadded) tokens,
scaled to unit length.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class MeanPool:
    """TorchServe's handler shape; preprocess and postprocess are left out (identity)."""

    def initialize(self, context: Any) -> None:
        self.eps = 1e-12

    def inference(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tokens = batch["token_embeddings"]
        mask = batch["attention_mask"][..., np.newaxis].astype(tokens.dtype)
        counts = np.clip(mask.sum(axis=1), 1e-9, None)
        mean = (tokens * mask).sum(axis=1) / counts
        norms = np.linalg.norm(mean, axis=1, keepdims=True)
        return {"embedding": mean / np.clip(norms, self.eps, None)}
