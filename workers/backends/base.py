"""What a backend does: run one batch, named numpy arrays in, named numpy arrays out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from weir.autocomplete import model_path
from weir.config import ModelConfig
from weir.errors import ConfigError
from workers.threads import ThreadShare, available_cores


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


class RuntimeBackend(ModelBackend):
    """A model loaded once by a runtime with threads of its own, shared by its instances.

    ONNX Runtime and OpenVINO are such runtimes. ``share`` is the worker's threads; its total
    is the cores this process may use unless the worker set it. ``instances``: how many
    instances of the model the worker runs. A subclass loads the model in :meth:`load`;
    whatever the runtime raises there stops the load with the file and the runtime's reason.
    """

    shareable = True
    runtime = "the runtime"  # its name, in a load error

    def __init__(
        self,
        config: ModelConfig,
        version_dir: Path,
        share: ThreadShare | None = None,
        instances: int = 1,
    ) -> None:
        self.config = config
        self.share = share or ThreadShare()
        self.share.know(available_cores())
        self.path = model_path(config, version_dir)
        self.instances = max(instances, 1)
        try:
            self.load()
        except ConfigError:
            raise
        except Exception as exc:  # each runtime raises types of its own
            raise ConfigError(f"{self.path}: {self.runtime} cannot load the model: {exc}") from None

    @abstractmethod
    def load(self) -> None:
        """Load the model at ``self.path`` for ``self.config``."""
