"""What a backend does: run one batch, named numpy arrays in, named numpy arrays out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from weir.autocomplete import model_path
from weir.config import ModelConfig
from weir.errors import ConfigError
from weir.handler_metrics import HandlerSample
from workers.threads import ThreadShare, available_cores


class ModelBackend(ABC):
    """One loaded instance of a model."""

    # True when one loaded object may serve every instance of its model, each from its own
    # thread at the same time: the weights are then in memory once, not once per instance.
    shareable = False
    # The CUDA device this instance runs on (an index among the devices the worker sees);
    # None: the CPU.
    device: int | None = None
    # True when ``infer`` may wait on the worker's own event loop (a Triton Python model
    # calling other models, BLS, or running an ``async def execute``): its batches then never
    # run in that loop, where such a wait could not be answered.
    waits_on_the_loop = False

    def instance(self) -> ModelBackend:
        """What one more instance of this loaded, ``shareable`` model calls ``infer`` on.

        On the CPU the loaded object itself. A backend on a CUDA device returns a view that
        shares its weights and has a CUDA stream (and staging buffers) of its own.
        """
        return self

    def close(self) -> None:  # noqa: B027 (most backends hold nothing to release)
        """Release what the instance holds when its lane stops (a Triton model's finalize)."""

    def handler_samples(self) -> list[HandlerSample]:
        """The metrics a handler of this instance recorded (TorchServe archives); none else."""
        return []

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
    instances of the model the worker runs (on ``device`` when that is a CUDA device's index;
    a model is loaded once per device). A subclass loads the model in :meth:`load`;
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
        device: int | None = None,
    ) -> None:
        self.config = config
        self.device = device
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
