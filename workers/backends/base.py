"""What a backend does: run one batch, named numpy arrays in, named numpy arrays out."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class ModelBackend(ABC):
    """One loaded instance of a model."""

    @abstractmethod
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a whole batch. Called from an executor thread, one call at a time."""
