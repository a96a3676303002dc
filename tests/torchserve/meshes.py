"""A mesh serving a TorchServe model store, with the management API on a port of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import Mesh, free_port, private_mesh


@contextmanager
def store_mesh(
    store: Path, repository: Path, management_token: str, **env: str
) -> Iterator[tuple[Mesh, str]]:
    """A mesh on ``store`` (model control explicit) and its management API's URL.

    ``env``: more settings of the mesh's processes.
    """
    port = free_port()
    settings = {
        "WEIR_MODEL_STORE": str(store),
        "WEIR_MODEL_CONTROL_MODE": "explicit",
        "WEIR_GATEWAY_TS_MANAGEMENT_PORT": str(port),
        "WEIR_GATEWAY_TS_GRPC_INFERENCE_PORT": str(free_port()),
        "WEIR_GATEWAY_TS_GRPC_MANAGEMENT_PORT": str(free_port()),
        "WEIR_GATEWAY_MANAGEMENT_TOKEN": management_token,
        **env,
    }
    with private_mesh(repository, settings) as mesh:
        yield mesh, f"http://127.0.0.1:{port}"


def register(management: str, token: str, url: str, **params: Any) -> httpx.Response:
    """Register the store's archive ``url`` with one worker, synchronously."""
    query = {"url": url, "initial_workers": 1, "synchronous": "true", **params}
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.post(f"{management}/models", params=query, headers=headers, timeout=120)


@dataclass(frozen=True)
class TsConfig:
    """A ``config.properties`` written for ``weir up --ts-config``, and the ports it names."""

    path: Path
    http_port: int
    management_port: int
    metrics_port: int
    grpc_inference_port: int
    grpc_management_port: int


def write_ts_config(directory: Path, store: Path, *lines: str) -> TsConfig:
    """``directory/config.properties``: free ports for the five APIs, ``store``, ``lines``."""
    ports = free_port(), free_port(), free_port(), free_port(), free_port()
    path = directory / "config.properties"
    path.write_text(
        f"inference_address=http://127.0.0.1:{ports[0]}\n"
        f"management_address=http://127.0.0.1:{ports[1]}\n"
        f"metrics_address=http://127.0.0.1:{ports[2]}\n"
        f"grpc_inference_port={ports[3]}\n"
        f"grpc_management_port={ports[4]}\n"
        f"model_store={store}\n" + "".join(f"{line}\n" for line in lines)
    )
    return TsConfig(path, *ports)
