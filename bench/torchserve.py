"""TorchServe as a peer: its own venv, ``.mar`` archives of the same models, its config.

TorchServe (the ``torchserve`` and ``torch-model-archiver`` packages from PyPI, with the same
torch release as Weir's venv) is installed into ``bench/results/torchserve-venv``, once. Each
run archives the benchmark repository's ``model.pt`` files with :mod:`bench.torchserve_handler`
and writes a ``config.properties`` that maps each model's Weir config onto TorchServe's
settings (:func:`model_settings`): the same batch size and delay, as many workers as Weir's
instances, each with its share of the worker's torch threads. The server itself is
:class:`bench.torchserve_server.TorchServeServer`.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.torchserve_handler import SPEC_FILE

logger = logging.getLogger(__name__)

TORCHSERVE_VERSION = "0.12.0"
HANDLER = Path(__file__).resolve().parent / "torchserve_handler.py"
# What the handler imports besides torch (orjson parses as Weir's gateway does), and
# PyYAML, which TorchServe's worker imports without declaring it.
HANDLER_PACKAGES = ("orjson", "numpy", "pyyaml")
RESPONSE_TIMEOUT_S = 120


@dataclass(frozen=True)
class TorchServeModel:
    """One model's TorchServe settings, mapped from its Weir ``config.yaml``."""

    name: str
    batch_size: int
    max_batch_delay_ms: int
    workers: int
    torch_threads: int  # per worker: the workers share what one Weir worker has


def _batch_size(config: dict[str, Any]) -> int:
    """Weir's batch: the largest preferred size when set (Weir forms those), else the max."""
    batching = config.get("dynamic_batching")
    if batching is None:
        return 1  # without dynamic_batching Weir runs each request alone
    preferred = batching.get("preferred_batch_size") or []
    return int(max(preferred, default=0) or max(int(config.get("max_batch_size", 0)), 1))


def _delay_ms(config: dict[str, Any]) -> int:
    """Weir's queue delay in TorchServe's whole milliseconds; a non-zero delay stays non-zero."""
    delay_us = int((config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds", 0))
    return max(round(delay_us / 1000), 1) if delay_us > 0 else 0


def model_settings(config: dict[str, Any], worker_threads: int) -> TorchServeModel:
    """TorchServe's batch size, delay and workers for a model, from its Weir config.

    ``worker_threads``: the torch threads a Weir worker has in all. Weir's instances share
    them; TorchServe's workers are processes that cannot, so each gets an equal part (as
    TorchServe's own CPU launcher divides cores between workers), at least one.
    """
    groups = config.get("instance_group") or [{}]
    workers = sum(int(group.get("count", 1)) for group in groups)
    return TorchServeModel(
        name=config["name"],
        batch_size=_batch_size(config),
        max_batch_delay_ms=_delay_ms(config),
        workers=workers,
        torch_threads=max(worker_threads // workers, 1),
    )


def read_settings(
    repository: Path, models: list[str], worker_threads: int
) -> list[TorchServeModel]:
    configs = [yaml.safe_load((repository / m / "config.yaml").read_text()) for m in models]
    return [model_settings(config, worker_threads) for config in configs]


def models_property(models: list[TorchServeModel]) -> str:
    """The ``models=`` value of config.properties: each archive with its batching and workers."""
    entries = {
        m.name: {
            "1.0": {
                "defaultVersion": True,
                "marName": f"{m.name}.mar",
                "minWorkers": m.workers,
                "maxWorkers": m.workers,
                "batchSize": m.batch_size,
                "maxBatchDelay": m.max_batch_delay_ms,
                "responseTimeout": RESPONSE_TIMEOUT_S,
            }
        }
        for m in models
    }
    return json.dumps(entries, separators=(",", ":"))


@dataclass(frozen=True)
class Ports:
    """TorchServe's listening ports, all on 127.0.0.1."""

    inference: int
    management: int
    metrics: int
    grpc_inference: int
    grpc_management: int


def config_properties(ports: Ports, store: Path, models: list[TorchServeModel]) -> str:
    """TorchServe's config.properties: loopback ports, the models, quiet and lean.

    No token authorisation, no system metrics (a Python process spawned every minute), the
    frontend's queue deep enough for every connection, and bodies handed to the handler
    undecoded (it parses them with orjson, as Weir's gateway does).
    """
    host = "http://127.0.0.1"
    lines = {
        "inference_address": f"{host}:{ports.inference}",
        "management_address": f"{host}:{ports.management}",
        "metrics_address": f"{host}:{ports.metrics}",
        "grpc_inference_address": "127.0.0.1",
        "grpc_management_address": "127.0.0.1",
        "grpc_inference_port": ports.grpc_inference,
        "grpc_management_port": ports.grpc_management,
        "model_store": store,
        "load_models": ",".join(f"{m.name}.mar" for m in models),
        "models": models_property(models),
        "disable_token_authorization": "true",
        "enable_model_api": "true",
        "disable_system_metrics": "true",
        "async_logging": "true",
        "decode_input_request": "false",
        "default_response_timeout": RESPONSE_TIMEOUT_S,
        "job_queue_size": 1000,
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


# Only warnings and errors, to the server's log file (stdout): no access, model or
# metrics log files written per request.
LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <Console name="STDOUT" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="io.netty" level="error"/>
    <Logger name="org.apache" level="off"/>
    <Root level="warn"><AppenderRef ref="STDOUT"/></Root>
  </Loggers>
</Configuration>
"""


def requirements() -> list[str]:
    """TorchServe's venv: its packages pinned, and the torch release of this venv."""
    torch = importlib.metadata.version("torch").split("+")[0]  # the local label is the wheel's
    packages = [f"torchserve=={TORCHSERVE_VERSION}", f"torch-model-archiver=={TORCHSERVE_VERSION}"]
    return [*packages, f"torch=={torch}", *HANDLER_PACKAGES]


def ensure_venv(venv: Path) -> Path:
    """TorchServe's own venv, made and filled with pip when missing or differently pinned."""
    wanted = requirements()
    stamp = venv / "weir-bench-requirements.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return venv
    logger.info("installing TorchServe into %s: %s", venv, " ".join(wanted))
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *wanted]
    subprocess.run(pip, check=True)
    stamp.write_text(json.dumps(wanted))
    return venv


def ensure_java() -> str:
    """The java binary TorchServe's frontend needs; Debian's JRE when missing."""
    found = shutil.which("java")
    if found:
        return found
    logger.info("java not found; installing default-jre-headless with apt-get")
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends"]
        subprocess.run([*install, "default-jre-headless"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(
            f"TorchServe needs Java 11+ and it could not be installed ({exc}); install it "
            "(apt-get install default-jre-headless) or leave TorchServe out (--peers baseline)"
        ) from exc
    return shutil.which("java") or "java"


def archive(venv: Path, repository: Path, model: TorchServeModel, store: Path) -> Path:
    """``<store>/<model>.mar``: the model's ``model.pt``, the handler and the handler's spec."""
    config = yaml.safe_load((repository / model.name / "config.yaml").read_text())
    spec = {
        "name": model.name,
        "inputs": [item["name"] for item in config["input"]],
        "outputs": [item["name"] for item in config["output"]],
        "torch_threads": model.torch_threads,
    }
    spec_dir = store / f".{model.name}"
    spec_dir.mkdir(parents=True, exist_ok=True)
    (spec_dir / SPEC_FILE).write_text(json.dumps(spec))
    command = [str(venv / "bin" / "torch-model-archiver"), "--model-name", model.name]
    command += ["--version", "1.0", "--handler", str(HANDLER), "--export-path", str(store)]
    command += ["--serialized-file", str(repository / model.name / "1" / "model.pt")]
    command += ["--extra-files", str(spec_dir / SPEC_FILE), "--force"]
    subprocess.run(command, check=True)
    shutil.rmtree(spec_dir)
    return store / f"{model.name}.mar"


def settings_record(models: list[TorchServeModel]) -> list[dict[str, Any]]:
    """The run record's note of how each model was configured."""
    return [asdict(m) for m in models]
