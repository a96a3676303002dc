"""A wheel too big for one call to the GPU machine, cut into parts that travel one a call.

A call to the lent GPU machine carries at most 64 MiB with the working tree, and what a call
left in ignored folders stays there while the machine is warm. onnxruntime-gpu's wheel is
about 250 MB: :func:`split` cuts it into ``FOLDER/1``, ``FOLDER/2``, ... (each with the
manifest: the wheel's name, size and SHA-256, and the number of parts), one call carries
each, and the device check joins them there (:func:`join`), refusing a wheel with a part missing
or changed. The last part is the small one, to travel beside ``.whl`` with the check itself.

    python tests/gpu/wheel_parts.py split WHEEL FOLDER [--part-mib 56] [--last-mib 24]
    python tests/gpu/wheel_parts.py join FOLDER OUT_DIR     # prints the joined wheel's path
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
from pathlib import Path

MIB = 1 << 20
MANIFEST = "manifest.json"


def plan(size: int, part_bytes: int, last_bytes: int) -> list[int]:
    """The parts' sizes, in order: the head in parts of ``part_bytes``, then the last."""
    last = min(size, last_bytes)
    head = size - last
    count = math.ceil(head / part_bytes) if head else 0
    sizes = [part_bytes] * count
    if count:
        sizes[-1] = head - part_bytes * (count - 1)
    return [*sizes, last]


def split(wheel: Path, folder: Path, part_mib: float = 56, last_mib: float = 24) -> list[Path]:
    """Cut ``wheel`` into numbered folders under ``folder``; returns the parts' paths."""
    data = wheel.read_bytes()
    sizes = plan(len(data), int(part_mib * MIB), int(last_mib * MIB))
    manifest = {
        "wheel": wheel.name,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "parts": len(sizes),
    }
    shutil.rmtree(folder, ignore_errors=True)
    parts, offset = [], 0
    for number, size in enumerate(sizes, 1):
        part = folder / str(number) / f"{wheel.name}.part"
        part.parent.mkdir(parents=True)
        part.write_bytes(data[offset : offset + size])
        (part.parent / MANIFEST).write_text(json.dumps(manifest))
        parts.append(part)
        offset += size
    return parts


def join(folder: Path, out_dir: Path) -> Path:
    """The wheel rebuilt from ``folder``'s parts, in ``out_dir``.

    Raises ValueError naming the parts missing, or the size and digest that do not match.
    """
    manifests = sorted(folder.glob(f"*/{MANIFEST}"))
    if not manifests:
        raise ValueError(f"no parts under {folder}")
    manifest = json.loads(manifests[0].read_text())
    paths = [folder / str(n) / f"{manifest['wheel']}.part" for n in range(1, manifest["parts"] + 1)]
    missing = [n for n, path in enumerate(paths, 1) if not path.is_file()]
    if missing:
        raise ValueError(
            f"{manifest['wheel']}: parts {missing} of {manifest['parts']} are not under "
            f"{folder} (each travels in its own call while the machine is warm)"
        )
    data = b"".join(path.read_bytes() for path in paths)
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != manifest["size"] or digest != manifest["sha256"]:
        raise ValueError(
            f"{manifest['wheel']}: the joined parts are {len(data)} bytes, SHA-256 {digest}; "
            f"the wheel was {manifest['size']} bytes, {manifest['sha256']}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / manifest["wheel"]
    wheel.write_bytes(data)
    return wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split")
    cut.add_argument("wheel", type=Path)
    cut.add_argument("folder", type=Path)
    cut.add_argument("--part-mib", type=float, default=56)
    cut.add_argument("--last-mib", type=float, default=24)
    glue = commands.add_parser("join")
    glue.add_argument("folder", type=Path)
    glue.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "split":
        for part in split(args.wheel, args.folder, args.part_mib, args.last_mib):
            print(f"{part.parent}  {part.stat().st_size / MIB:.1f} MiB")
        return 0
    try:
        print(join(args.folder, args.out_dir))
    except ValueError as exc:
        print(f"wheel_parts: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
