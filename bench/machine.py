"""Where and when a run happened, so that a result can be told apart from a noisy one."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: above ~0.5 before a run, something else is busy."""
    return [round(x, 2) for x in os.getloadavg()]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """CPU, memory, versions, and the load average before the run starts."""
    cores = os.cpu_count() or 0
    memory_gib = psutil.virtual_memory().total / 2**30
    return {
        "summary": f"{cores} cores ({cpu_model()}), {memory_gib:.0f} GiB, {platform.system()}",
        "cores": cores,
        "python": platform.python_version(),
        "torch": metadata.version("torch"),
        "onnxruntime": _version("onnxruntime"),
        "openvino": _version("openvino"),
        "load_avg_start": load_average(),
    }
