"""The load generator: ``wrk`` (Debian's package) with ``post.lua``, closed loop.

One wrk thread (``-t1``) keeps ``concurrency`` connections, each sending its next request
as soon as the previous answer arrives. The Lua script prints the run's totals and latency
percentiles as JSON, which :func:`parse_output` reads.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LUA_SCRIPT = Path(__file__).resolve().parent / "post.lua"
MARKER = "WRK_JSON "


@dataclass(frozen=True)
class WrkResult:
    """One wrk run: request counts, errors and latency percentiles in microseconds."""

    requests: int
    duration_s: float
    errors: int
    p50_us: int
    p90_us: int
    p99_us: int
    mean_us: float

    @property
    def ok_per_s(self) -> float:
        """Answered requests per second, failed ones (non-2xx, timeouts...) left out."""
        return max(self.requests - self.errors, 0) / self.duration_s


def parse_output(stdout: str) -> WrkResult:
    """The result line ``post.lua`` printed; ValueError when there is none."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(MARKER)), None)
    if line is None:
        raise ValueError(f"wrk printed no result line:\n{stdout}")
    raw: dict[str, Any] = json.loads(line.removeprefix(MARKER))
    latency = raw["latency_us"]
    return WrkResult(
        requests=raw["requests"],
        duration_s=raw["duration_us"] / 1e6,
        errors=sum(raw["errors"].values()),
        p50_us=latency["p50"],
        p90_us=latency["p90"],
        p99_us=latency["p99"],
        mean_us=latency["mean"],
    )


def ensure_wrk() -> str:
    """The wrk binary; installs Debian's package when missing, else says what to do."""
    found = shutil.which("wrk")
    if found:
        return found
    logger.info("wrk not found; installing it with apt-get")
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(
            f"the benchmark needs wrk and could not install it ({exc}); "
            "install it yourself (apt-get install wrk, brew install wrk) and run again"
        ) from exc
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("apt-get installed wrk but it is not on PATH")
    return found


def run_wrk(
    url: str, body: Path, concurrency: int, duration_s: float, threads: int = 1
) -> WrkResult:
    """One closed-loop run against ``url``, from ``threads`` wrk threads."""
    command = [
        ensure_wrk(),
        f"-t{threads}",
        f"-c{concurrency}",
        f"-d{max(round(duration_s), 1)}s",
        "--timeout",
        "30s",
        "-s",
        str(LUA_SCRIPT),
        url,
    ]
    env = {**os.environ, "WEIR_BENCH_BODY": str(body)}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, check=True, timeout=duration_s + 60
    )
    return parse_output(done.stdout)
