"""Helpers for the lifecycle tests: versions of an MLP with their own weights, and a load.

Each version of ``mlp`` is a TorchScript MLP seeded by its version number, so an answer
shows which version computed it; the load keeps ``concurrency`` clients busy and records,
per answer, its status, the version that answered and whether the output is that version's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
import yaml

WIDTHS = (16, 32, 4)


def mlp_module(seed: int) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = torch.nn.Sequential(
            torch.nn.Linear(WIDTHS[0], WIDTHS[1]),
            torch.nn.ReLU(),
            torch.nn.Linear(WIDTHS[1], WIDTHS[2]),
        )
    return module.eval()


def mlp_config(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "pytorch",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTHS[0]]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTHS[-1]]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 1000},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
        **fields,
    }


def write_config(model_dir: Path, config: dict[str, Any]) -> None:
    """Replace the config at once (a poller never reads half a file)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = model_dir / ".config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(config))
    os.replace(tmp, model_dir / "config.yaml")


def add_version(model_dir: Path, version: int) -> None:
    """Version ``version``'s directory, built aside and renamed into place whole."""
    staging = model_dir.parent / f".staging-{model_dir.name}-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    torch.jit.script(mlp_module(version)).save(str(staging / "model.pt"))
    os.replace(staging, model_dir / str(version))


def sample_rows(count: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((count, WIDTHS[0]), dtype=np.float32)


def expected(version: str, row: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return mlp_module(int(version))(torch.from_numpy(row[None, :])).numpy()[0]


@dataclass
class Answer:
    status: int
    version: str
    correct: bool
    sent_s: float
    text: str = ""


@dataclass
class Load:
    """``concurrency`` clients calling one model until stopped."""

    url: str
    model: str
    concurrency: int = 30
    answers: list[Answer] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    rows: np.ndarray = field(default_factory=lambda: sample_rows(64))
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    async def more(self, count: int, timeout_s: float = 60.0) -> None:
        """Wait until ``count`` more requests are answered, in the mesh's present state."""
        target = len(self.answers) + count
        async with asyncio.timeout(timeout_s):
            while len(self.answers) < target:
                self.answered.clear()
                await self.answered.wait()

    async def run(self, max_s: float = 120.0) -> list[Answer]:
        deadline = time.monotonic() + max_s
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(
                *(self._client(client, i, deadline) for i in range(self.concurrency))
            )
        return self.answers

    async def _client(self, client: httpx.AsyncClient, index: int, deadline: float) -> None:
        i = index
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.answers.append(await self._one(client, self.rows[i % len(self.rows)]))
            self.answered.set()
            i += self.concurrency

    async def _one(self, client: httpx.AsyncClient, row: np.ndarray) -> Answer:
        sent = time.monotonic()
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, row.size], "data": row.tolist()}
            ]
        }
        try:
            response = await client.post(f"{self.url}/v2/models/{self.model}/infer", json=body)
        except httpx.HTTPError as exc:
            return Answer(0, "", False, sent, repr(exc))
        if response.status_code != 200:
            return Answer(response.status_code, "", False, sent, response.text)
        reply = response.json()
        version = str(reply["model_version"])
        got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32)
        correct = bool(np.allclose(got, expected(version, row), atol=1e-4))
        return Answer(200, version, correct, sent)

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200 or not a.correct]

    def versions_since(self, since_s: float) -> set[str]:
        return {a.version for a in self.answers if a.sent_s >= since_s and a.status == 200}
