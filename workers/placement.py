"""Where a worker pool runs a model's instances: pool membership and device placement.

A model belongs to the pools its ``instance_group`` kinds name: ``KIND_CPU`` and
``KIND_MODEL`` to ``cpu``, ``KIND_GPU`` to ``gpu``. ``KIND_AUTO`` keeps Triton's meaning, a GPU
when there is one: the ``gpu`` pool places it on its CUDA devices and the ``cpu`` pool runs it
on the CPU, so a mesh with both pools serves it from both, and one without a gpu pool from the
CPU. A TensorRT engine runs on CUDA devices only, so its ``KIND_AUTO`` groups are the gpu
pool's alone; OpenVINO runs on the CPU only (not on NVIDIA GPUs), so its are the cpu pool's.

Triton counts a GPU group's ``count`` per GPU its ``gpus`` lists (``gpus: [0, 1], count: 2``:
four instances, two on each), and an empty ``gpus`` lists every visible device. The ids index
the devices this process sees, so ``CUDA_VISIBLE_DEVICES`` decides which GPUs those are.

The gpu pool refuses at once, naming the model, what it cannot place: no CUDA device, a listed
GPU it does not see, a TensorRT model without the ``tensorrt`` module. It never runs a GPU
group on the CPU. Only the gpu pool asks CUDA anything (torch is imported lazily there): the
cpu pool, the gateway and the batcher never initialise CUDA.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass

from weir.config import Backend, InstanceGroup, InstanceKind, ModelConfig
from weir.errors import ConfigError

POOL_KINDS: dict[str, frozenset[InstanceKind]] = {
    "cpu": frozenset({InstanceKind.CPU, InstanceKind.AUTO, InstanceKind.MODEL}),
    "gpu": frozenset({InstanceKind.GPU, InstanceKind.AUTO}),
}
# Backends whose models run on CUDA devices only, and the module each needs there.
GPU_ONLY_BACKENDS: dict[Backend, str] = {Backend.TENSORRT: "tensorrt"}
# Backends whose models run on the CPU only.
CPU_ONLY_BACKENDS = frozenset({Backend.OPENVINO})
TENSORRT_INSTALL = (
    "pip install tensorrt-cu12 (tensorrt-cu13 for CUDA 13), as the weir-cuda image does"
)


@dataclass(frozen=True)
class Placement:
    """One instance of a model: the CUDA device it is pinned to (None: the CPU), its group."""

    device: int | None
    group: str


@dataclass(frozen=True)
class Devices:
    """The CUDA devices a worker sees, and why those: ``detail`` goes into the errors."""

    count: int
    detail: str = ""


NO_DEVICES = Devices(0, "the cpu pool asks for none")


def pool_groups(config: ModelConfig, pool: str) -> list[tuple[str, InstanceGroup]]:
    """The instance groups of ``config`` that ``pool`` runs, each with its name.

    An unnamed group takes Triton's name, ``<model>_<index>``.
    """
    kinds = POOL_KINDS.get(pool, frozenset())
    if pool == "cpu" and config.backend in GPU_ONLY_BACKENDS:
        kinds = kinds - {InstanceKind.AUTO}  # "a GPU when there is one": it needs one
    if pool == "gpu" and config.backend in CPU_ONLY_BACKENDS:
        kinds = kinds - {InstanceKind.AUTO}  # none of its devices is one it runs on
    return [
        (group.name or f"{config.name}_{index}", group)
        for index, group in enumerate(config.instance_group)
        if group.kind in kinds
    ]


def instance_count(config: ModelConfig, pool: str, visible_gpus: int = 1) -> int:
    """How many instances of ``config`` a worker of ``pool`` runs (0: not this pool's model).

    In the gpu pool a group's ``count`` is per listed GPU, and an empty ``gpus`` lists the
    ``visible_gpus`` the worker sees; the default, one, says whether the pool serves the model
    without asking CUDA.
    """
    if pool != "gpu":
        return sum(group.count for _, group in pool_groups(config, pool))
    return sum(
        group.count * (len(group.gpus) or visible_gpus) for _, group in pool_groups(config, pool)
    )


def placements(config: ModelConfig, pool: str, devices: Devices) -> list[Placement]:
    """Every instance ``pool`` runs of ``config``, each on its device, in group order.

    ConfigError, naming the model, for what the pool cannot place.
    """
    groups = pool_groups(config, pool)
    if pool != "gpu":
        if groups and config.backend in GPU_ONLY_BACKENDS:
            raise ConfigError(
                f"model '{config.name}': backend '{config.backend.value}' runs on CUDA devices "
                "only; give its instance_group kind KIND_GPU (or KIND_AUTO) for the gpu pool"
            )
        return [Placement(None, name) for name, group in groups for _ in range(group.count)]
    if groups and config.backend in CPU_ONLY_BACKENDS:
        raise ConfigError(
            f"model '{config.name}': backend '{config.backend.value}' runs on the CPU only; give "
            "its instance_group kind KIND_CPU (or KIND_AUTO) for the cpu pool"
        )
    return [p for name, group in groups for p in _on_devices(config, name, group, devices)]


def _on_devices(
    config: ModelConfig, name: str, group: InstanceGroup, devices: Devices
) -> list[Placement]:
    """A GPU group's instances: ``count`` on each GPU it lists, or on each visible one."""
    if devices.count == 0:
        kind = group.kind.value + (", in the gpu pool," if group.kind is InstanceKind.AUTO else "")
        raise ConfigError(
            f"model '{config.name}': instance_group kind {kind} needs a CUDA device, and this "
            f"worker sees none ({devices.detail})"
        )
    missing = [gpu for gpu in group.gpus if not 0 <= gpu < devices.count]
    if missing:
        listed = ", ".join(str(gpu) for gpu in missing)
        raise ConfigError(
            f"model '{config.name}': instance_group '{name}' lists GPU {listed}, but this worker "
            f"sees {_seen(devices.count)} ({devices.detail}); the ids in gpus index the devices "
            "it sees"
        )
    gpus = group.gpus or tuple(range(devices.count))
    return [Placement(gpu, name) for gpu in gpus for _ in range(group.count)]


def _seen(count: int) -> str:
    if count == 1:
        return "1 CUDA device, id 0"
    return f"{count} CUDA devices, ids 0 to {count - 1}"


def place(config: ModelConfig, pool: str) -> list[Placement]:
    """The instances this worker runs of ``config``; ConfigError when it cannot run them.

    The cpu pool asks no device anything. The gpu pool checks the backend's module, asks CUDA
    what it sees, and places every instance on a device, or refuses.
    """
    if pool != "gpu":
        return placements(config, pool, NO_DEVICES)
    check_backend_module(config)
    return placements(config, pool, visible_devices())


def check_backend_module(config: ModelConfig) -> None:
    """ConfigError when the module a GPU-only backend needs cannot be imported."""
    module = GPU_ONLY_BACKENDS.get(config.backend)
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"model '{config.name}': backend '{config.backend.value}' needs the {module} module, "
            f"and this worker cannot import it ({exc}): {TENSORRT_INSTALL}"
        ) from None


def visible_devices() -> Devices:
    """The CUDA devices this process sees, asked of torch's runtime (the gpu pool only).

    ``torch.cuda.device_count`` honours ``CUDA_VISIBLE_DEVICES`` and, like ``is_available``,
    leaves CUDA uninitialised: no context is made on any device.
    """
    try:
        import torch
    except ImportError as exc:
        return Devices(0, f"torch cannot be imported: {exc}; {_visible_variable()}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    notes = [] if count else ["torch.cuda.is_available() is false"]
    if torch.version.cuda is None:
        notes.append(f"torch {torch.__version__} is built without CUDA")
    return Devices(count, "; ".join([*notes, _visible_variable()]))


def _visible_variable() -> str:
    # CUDA's own variable, not a Weir setting: read only to say it in an error.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return "CUDA_VISIBLE_DEVICES is unset"
    return f"CUDA_VISIBLE_DEVICES={visible!r}"
