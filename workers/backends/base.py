"""What a backend does: run one batch, named numpy arrays in, named numpy arrays out."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class ModelBackend(ABC):
    """One loaded instance of a model."""

    # True when one loaded object may serve every instance of its model, each from its own
    # thread at the same time: the weights are then in memory once, not once per instance.
    shareable = False

    @abstractmethod
    def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run a whole batch. Called from an executor thread (or the worker's event loop).

        One call at a time per instance; a ``shareable`` backend also runs calls of its
        model's other instances at the same time.
        """
