"""all-MiniLM-L6-v2's tokenizer as a Weir python model: TEXT (BYTES) -> token ids and mask.

Uses the ``tokenizers`` library with the model's own ``tokenizer.json`` (lower-casing
WordPiece, ``[CLS] ... [SEP]``), copied next to this file by ``examples/build_models.py``.
Every row is truncated and padded to ``max_length`` (128) tokens, so the requests of a
batch, and the batches of the encoder after it, all have one shape. A batch is tokenized a
few texts at a time, and given up (504) as soon as nobody waits for it any more.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from weir.errors import DeadlineExceeded

TEXTS_PER_STEP = 8  # between two looks at whether anyone still waits


class MiniLMTokenizer:
    """TorchServe's handler shape; each method sees the whole batch."""

    def initialize(self, context: Any) -> None:
        self.context = context
        max_length = int(context.parameters.get("max_length", "128"))
        self.tokenizer = Tokenizer.from_file(str(context.model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(length=max_length, pad_id=0, pad_token="[PAD]")

    def preprocess(self, batch: dict[str, np.ndarray]) -> list[str]:
        # TEXT is [batch, 1] of bytes; a bad UTF-8 byte must not fail the batch-mates.
        return [text.decode("utf-8", errors="replace") for text in batch["TEXT"].reshape(-1)]

    def inference(self, texts: list[str]) -> list[Encoding]:
        encodings: list[Encoding] = []
        for start in range(0, len(texts), TEXTS_PER_STEP):
            if self.context.is_cancelled():
                raise DeadlineExceeded(DeadlineExceeded.TRITON_TEXT)
            encodings.extend(self.tokenizer.encode_batch(texts[start : start + TEXTS_PER_STEP]))
        return encodings

    def postprocess(self, encodings: list[Encoding]) -> dict[str, np.ndarray]:
        return {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        }
