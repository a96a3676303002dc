"""A reload that fails leaves what served before serving, and fails no request meanwhile.

Model ``a`` serves under load; a load of ``a`` with a config that names a model file no
worker can open is refused with the worker's reason, ``a`` keeps its old config, and no
request of the load fails.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import private_mesh
from tests.lifecycle.helpers import Load, add_version, mlp_config, write_config


async def reload_with_a_missing_file(url: str, load: Load) -> httpx.Response:
    await load.more(100)
    config = mlp_config("a", max_batch_size=4, default_model_filename="missing.pt")
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(
            f"{url}/v2/repository/models/a/load",
            json={"parameters": {"config": json.dumps(config)}},
        )
    await load.more(200)
    load.stop.set()
    return response


def config_and_index(url: str) -> tuple[dict[str, Any], list[dict[str, str]]]:
    config = httpx.get(f"{url}/v2/models/a/config").json()
    return config, httpx.post(f"{url}/v2/repository/index").json()


@pytest.mark.timeout(120)
async def test_a_failed_reload_keeps_the_old_config_serving(tmp_path: Path) -> None:
    write_config(tmp_path / "a", mlp_config("a"))
    add_version(tmp_path / "a", 1)
    env = {"WEIR_MODEL_CONTROL_MODE": "explicit", "WEIR_LOAD_MODEL": "a"}
    with private_mesh(tmp_path, env) as mesh:
        load = Load(mesh.url, "a", concurrency=10)
        _, response = await asyncio.gather(load.run(90), reload_with_a_missing_file(mesh.url, load))
        config, index = await asyncio.to_thread(config_and_index, mesh.url)

    assert response.status_code == 400
    assert "failed to load 'a'" in response.json()["error"]
    assert "missing.pt" in response.json()["error"]
    assert config["max_batch_size"] == 8  # the old config, not the refused one
    assert {"name": "a", "version": "1", "state": "READY", "reason": ""} in index
    assert not load.failures(), load.failures()[:3]
