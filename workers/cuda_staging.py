"""One GPU instance's CUDA stream and the pinned host buffers its batches cross through.

Each instance on a CUDA device owns a :class:`CudaStaging`: its own stream, so instances on
one device overlap their copies and kernels, and page-locked (pinned) host buffers, one per
tensor name, kept and grown across batches so that a batch costs no pinned allocation. A
batch goes: numpy array -> its pinned buffer -> the device (asynchronous, on the stream);
the model runs on the stream; each output -> its pinned buffer (asynchronous) -> one wait
for this stream alone -> a numpy copy. Nothing synchronises the whole device.

torch is imported when an instance is made: only the gpu pool makes one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Pinned buffers grow to the next power of two of bytes, from this size, so a model whose
# batch sizes vary settles on a few sizes instead of re-pinning on every larger batch.
MIN_PINNED_BYTES = 1 << 16


def pinned_size(nbytes: int) -> int:
    """The bytes a pinned buffer for ``nbytes`` holds: a power of two, at least the minimum."""
    size = MIN_PINNED_BYTES
    while size < nbytes:
        size <<= 1
    return size


class CudaStaging:
    """A CUDA stream on ``device`` and pinned host buffers by tensor name, for one instance.

    Not thread-safe: one instance runs one batch at a time.
    """

    def __init__(self, device: int) -> None:
        import torch

        self.torch = torch
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        self.pinned: dict[str, Any] = {}  # name -> a flat uint8 pinned tensor

    def buffer(self, name: str, nbytes: int) -> Any:
        """The pinned bytes kept for ``name``, grown (re-pinned) when too small."""
        held = self.pinned.get(name)
        if held is None or held.numel() < nbytes:
            held = self.torch.empty(pinned_size(nbytes), dtype=self.torch.uint8, pin_memory=True)
            self.pinned[name] = held
        return held

    def to_device(self, name: str, array: np.ndarray) -> Any:
        """``array`` on the device, copied through ``name``'s pinned buffer on the stream.

        Call inside :meth:`running`. The pinned buffer is free again once :meth:`to_host`'s
        wait returns (the stream has then done every copy queued before it).
        """
        torch = self.torch
        source = torch.from_numpy(np.ascontiguousarray(array))
        staged = _view(self.buffer(name, source.nbytes), source)
        staged.copy_(source)
        return staged.to(self.device, non_blocking=True)

    def to_host(self, outputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """Each device tensor back as numpy, through pinned buffers, one wait on the stream."""
        staged = {}
        for name, tensor in outputs.items():
            tensor = tensor.contiguous()
            nbytes = tensor.numel() * tensor.element_size()
            host = _view(self.buffer(f"out:{name}", nbytes), tensor)
            host.copy_(tensor, non_blocking=True)
            staged[name] = host
        self.stream.synchronize()  # this instance's stream only, never the whole device
        return {name: host.numpy().copy() for name, host in staged.items()}

    def running(self) -> Any:
        """A context in which torch queues work on this instance's stream and device."""
        return self.torch.cuda.stream(self.stream)


def _view(buffer: Any, like: Any) -> Any:
    """The first bytes of a flat uint8 ``buffer`` as a tensor of ``like``'s dtype and shape."""
    nbytes = like.numel() * like.element_size()
    return buffer[:nbytes].view(like.dtype).view(like.shape)
