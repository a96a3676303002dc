"""Triton's system shared-memory extension: regions a client registers, tensors read and written.

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers a window of it
(``offset``, ``byte_size``) under a region name, and then names the region in an input's or a
requested output's parameters (``shared_memory_region``, ``shared_memory_offset``,
``shared_memory_byte_size``) instead of sending the tensor's bytes. The gateway maps the window
read/write; an input's bytes are copied from it into the request, an output's into it from the
reply.

Regions belong to one gateway process: a gateway run with several processes holds one registry
in each, so a client must register with the process it infers through. The object behind a
region is checked before every use: one the client unlinked (or replaced) or truncated below the
window is a clear error, never a read past the end of a mapping.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.errors import ErrorKind, InvalidInput, NotFound, WeirError
from weir.tensors import Tensor

SHM_DIR = Path("/dev/shm")
# A POSIX shm name: one leading '/' at most, then a file name of /dev/shm (no '/', no NUL).
KEY = re.compile(r"^/?[^/\x00]{1,255}$")
REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
PARAMETERS = (REGION, OFFSET, BYTE_SIZE)


class RegionExists(InvalidInput):
    """A region of that name is registered already (400, as Triton; gRPC's ALREADY_EXISTS)."""


class RegionLimit(WeirError):
    """A registration past a limit of the gateway's settings (413, RESOURCE_EXHAUSTED)."""

    kind = ErrorKind.TOO_LARGE


class Region:
    """One registered window of a shm object, mapped read/write, with the object's descriptor.

    The descriptor stays open so the object's current size can be read before each use. A
    large body's tensors are read in the parse thread while the event loop may unregister the
    region: a read or write under way keeps the mapping open (the last one out closes it, so
    nobody waits for another's copy), and one that starts after is refused as unregistered.
    """

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self.path = SHM_DIR / key.lstrip("/")
        self.lock = threading.Lock()  # over closed and users: held for no copy
        self.users = 0  # reads and writes under way
        self.fd = _open(name, key, self.path)
        try:
            info = os.fstat(self.fd)
            if offset + byte_size > info.st_size:
                raise InvalidInput(
                    f"failed to register shared memory region '{name}': invalid args"
                )
            self.identity = (info.st_dev, info.st_ino)
            # mmap's offset must be a multiple of the allocation granularity: map from below it.
            self.skew = offset % mmap.ALLOCATIONGRANULARITY
            self.mapping = mmap.mmap(self.fd, byte_size + self.skew, offset=offset - self.skew)
        except OSError as exc:
            os.close(self.fd)
            raise InvalidInput(
                f"failed to register shared memory region '{name}': {exc.strerror}"
            ) from None
        except BaseException:
            os.close(self.fd)
            raise
        self.closed = False

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def read(self, offset: int, size: int) -> bytes:
        start = self.skew + offset
        with self._using():
            return self.mapping[start : start + size]

    def write(self, offset: int, data: bytes) -> None:
        start = self.skew + offset
        with self._using():
            self.mapping[start : start + len(data)] = data

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                if not self.users:
                    self._release()

    @contextlib.contextmanager
    def _using(self) -> Iterator[None]:
        with self.lock:
            self._check_live()
            self.users += 1
        try:
            yield
        finally:
            with self.lock:
                self.users -= 1
                if self.closed and not self.users:
                    self._release()

    def _release(self) -> None:
        self.mapping.close()
        os.close(self.fd)

    def _check_live(self) -> None:
        """Refuse a region that was unregistered, or whose object was removed or shrank.

        Touching a mapped page past the end of a truncated object would kill the process
        (SIGBUS), so the size is read first.
        """
        if self.closed:
            raise NotFound(f"shared memory region '{self.name}' was unregistered")
        try:
            current = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            current = None
        if current is None or (current.st_dev, current.st_ino) != self.identity:
            raise InvalidInput(
                f"shared memory region '{self.name}': its object '{self.key}' was removed; "
                "unregister the region"
            )
        size = os.fstat(self.fd).st_size
        if size < self.offset + self.byte_size:
            raise InvalidInput(
                f"shared memory region '{self.name}': its object '{self.key}' shrank to {size} "
                f"bytes, the region needs {self.offset + self.byte_size}; unregister the region"
            )


def _open(name: str, key: str, path: Path) -> int:
    if not KEY.match(key) or key.lstrip("/") in (".", ".."):
        raise InvalidInput(
            f"failed to register shared memory region '{name}': key {key[:64]!r} is not a POSIX "
            "shared-memory name (an optional leading '/', then a name with no '/')"
        )
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise InvalidInput(f"Unable to open shared memory region: '{key}'") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidInput(f"Unable to open shared memory region: '{key}'")
    return fd


@dataclass(frozen=True, slots=True)
class TensorRef:
    """Where in a registered region one tensor's bytes lie."""

    region: Region
    offset: int
    byte_size: int

    def read(self) -> bytes:
        return self.region.read(self.offset, self.byte_size)

    def write(self, output: str, data: bytes) -> None:
        if len(data) > self.byte_size:
            raise InvalidInput(
                f"shared memory size specified with the request for output '{output}' "
                f"({self.byte_size} bytes) should be at least {len(data)} bytes to hold the results"
            )
        self.region.write(self.offset, data)


class SharedMemoryRegistry:
    """The system shared-memory regions of one gateway process, by name."""

    def __init__(self, max_regions: int, max_region_bytes: int) -> None:
        self.max_regions = max_regions
        self.max_region_bytes = max_region_bytes
        self.regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidInput("'region name' is necessary to register system shared memory region")
        if name in self.regions:
            raise RegionExists(f"shared memory region '{name}' already in manager")
        self._check_limits(byte_size)
        self.regions[name] = Region(name, key, offset, byte_size)

    def unregister(self, name: str | None) -> None:
        """Unmap the region ``name`` (every region when None); an unknown name is no error."""
        names = list(self.regions) if name is None else [name]
        for each in names:
            region = self.regions.pop(each, None)
            if region is not None:
                region.close()

    def status(self, name: str | None) -> list[dict[str, Any]]:
        if name is None:
            return [region.status() for region in self.regions.values()]
        if name not in self.regions:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [self.regions[name].status()]

    def locate(self, where: str, parameters: dict[str, Any]) -> TensorRef | None:
        """The place a tensor's ``parameters`` name, bounds-checked; None when they name none."""
        if REGION not in parameters:
            stray = [key for key in (OFFSET, BYTE_SIZE) if key in parameters]
            if stray:
                raise InvalidInput(f"{where}: parameter '{stray[0]}' needs '{REGION}'")
            return None
        name = parameters[REGION]
        if not isinstance(name, str):
            raise InvalidInput(f"{where}: Unable to parse '{REGION}'")
        offset = _count(where, parameters, OFFSET, 0)
        byte_size = _count(where, parameters, BYTE_SIZE, None)
        region = self.regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        if offset >= region.byte_size:
            raise InvalidInput(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise InvalidInput(f"Invalid offset + byte size for shared memory region: '{name}'")
        return TensorRef(region, offset, byte_size)

    def close(self) -> None:
        self.unregister(None)

    def _check_limits(self, byte_size: int) -> None:
        if len(self.regions) >= self.max_regions:
            raise RegionLimit(
                f"this gateway process holds {len(self.regions)} shared memory regions, its "
                f"limit (WEIR_GATEWAY_SHARED_MEMORY_MAX_REGIONS is {self.max_regions})"
            )
        if byte_size <= 0:
            raise InvalidInput("a shared memory region's byte_size must be positive")
        if byte_size > self.max_region_bytes:
            raise RegionLimit(
                f"shared memory region of {byte_size} bytes exceeds the limit of "
                f"{self.max_region_bytes} (WEIR_GATEWAY_SHARED_MEMORY_MAX_REGION_BYTES)"
            )


def _count(where: str, parameters: dict[str, Any], key: str, default: int | None) -> int:
    value = parameters.get(key, default)
    if value is None:
        raise InvalidInput(f"{where}: parameter '{REGION}' needs '{key}'")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"{where}: Unable to parse '{key}'")
    return value


def input_tensor(
    ref: TensorRef, name: str, datatype: str, shape: tuple[int, ...], others: bool
) -> Tensor:
    """An input's tensor read from shared memory; ``others``: it also carries data (refused)."""
    if others:
        raise InvalidInput(
            f"input '{name}': Input must set only one of the following fields: 'data', "
            f"'binary_data_size' in 'parameters', '{REGION}' in 'parameters'"
        )
    return Tensor(datatype, shape, ref.read())


def write_outputs(refs: dict[str, TensorRef], outputs: dict[str, Tensor]) -> frozenset[str]:
    """Write each output asked for in shared memory into its place; the names written."""
    for name, ref in refs.items():
        ref.write(name, outputs[name].data)
    return frozenset(refs)
