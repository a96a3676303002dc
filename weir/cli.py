"""The ``weir`` command: the composition root.

Each subcommand imports its service inside itself, so ``weir gateway`` never imports
torch. Options given on the command line override environment variables, which override
defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from weir import __version__
from weir.cache_settings import cache_options
from weir.control.mode import ControlMode
from weir.errors import ConfigError
from weir.service import run
from weir.settings import (
    BatcherSettings,
    GatewaySettings,
    ServiceSettings,
    WorkerSettings,
)
from weir.torchserve import flags as torchserve_flags
from weir.trace_settings import trace_options
from weir.up_settings import UpSettings


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--redis-url",
        help="Redis URL: redis://, rediss://, unix:// or redis+sentinel://host:26379/<service> "
        "(env WEIR_REDIS_URL)",
    )
    parser.add_argument("--repository", type=Path, help="model repository (env WEIR_REPOSITORY)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING... (env WEIR_LOG_LEVEL)")
    parser.add_argument(
        "--model-control-mode",
        choices=[mode.value for mode in ControlMode],
        help="none (default), explicit or poll, as Triton's (env WEIR_MODEL_CONTROL_MODE)",
    )
    parser.add_argument(
        "--load-model",
        action="append",
        help="a model to load at start in mode explicit, repeatable; * for all "
        "(env WEIR_LOAD_MODEL, comma-separated)",
    )
    parser.add_argument(
        "--repository-poll-secs",
        type=float,
        help="seconds between looks at the repository in mode poll (env "
        "WEIR_REPOSITORY_POLL_SECS, default 15)",
    )


def _cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-config",
        action="append",
        help="Triton's response cache for models whose config enables response_cache, "
        "repeatable: local,size=BYTES (in each gateway process) or redis,host=H "
        "(redis,port=P, password, user, db; or redis,url=redis://...: shared by every gateway)",
    )
    parser.add_argument(
        "--trace-config",
        action="append",
        help="Triton's trace settings, repeatable: triton,file=PATH, level=TIMESTAMPS|TENSORS, "
        "rate=N, count=N, log-frequency=N (env WEIR_GATEWAY_TRACE_FILE, ..._LEVEL, ...)",
    )


def _torchserve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-store",
        type=Path,
        help="a TorchServe model store of .mar archives (env WEIR_MODEL_STORE): serves "
        "TorchServe's management API; needs --model-control-mode explicit",
    )
    parser.add_argument(
        "--ts-management-port",
        type=int,
        help="TorchServe's management API port with a model store, 0 for none (default 8081)",
    )
    parser.add_argument(
        "--ts-grpc-inference-port",
        type=int,
        help="TorchServe's gRPC inference API port with a model store, 0 for none (default 7070)",
    )
    parser.add_argument(
        "--ts-grpc-management-port",
        type=int,
        help="TorchServe's gRPC management API port with a model store, 0 for none (7071)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weir", description="Weir inference server")
    parser.add_argument("--version", action="version", version=f"weir {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser("up", help="run the whole mesh locally, with a private Redis")
    _common(up)
    up.add_argument("--http-port", type=int, help="gateway HTTP port (env WEIR_UP_HTTP_PORT)")
    up.add_argument("--grpc-port", type=int, help="gateway gRPC port, 0 for none (default 8001)")
    up.add_argument("--redis-port", type=int, help="private Redis port, 0: any free one")
    up.add_argument(
        "--redis-maxmemory",
        help="private Redis's maxmemory under noeviction, e.g. 1gb, 0: none (default 1gb)",
    )
    up.add_argument("--metrics-port", type=int, help="metrics port, 0 for none (default 8002)")
    up.add_argument("--gateway-processes", type=int, help="gateway processes (default 1)")
    up.add_argument("--cpu-workers", type=int, help="CPU worker pool processes (default 1)")
    up.add_argument("--batchers", type=int, help="batcher processes (default 1)")
    _cache(up)
    _torchserve(up)
    up.add_argument(
        "--models",
        nargs="+",
        help="TorchServe archives of the model store to serve at start: NAME=FILE.mar, "
        "FILE.mar, or all (as torchserve --models)",
    )
    up.add_argument(
        "--ts-config",
        type=Path,
        help="a TorchServe config.properties (addresses, model_store, load_models, models, "
        "default_workers_per_model, max_request_size, max_response_size)",
    )
    torchserve_flags.add_to(up)

    gateway = commands.add_parser("gateway", help="the KServe v2 gateway (HTTP and gRPC)")
    _common(gateway)
    gateway.add_argument("--host", help="bind address (env WEIR_GATEWAY_HOST)")
    gateway.add_argument("--http-port", type=int, help="HTTP port (env WEIR_GATEWAY_HTTP_PORT)")
    gateway.add_argument(
        "--grpc-port", type=int, help="gRPC port, 0 for none (env WEIR_GATEWAY_GRPC_PORT)"
    )
    gateway.add_argument("--metrics-port", type=int, help="metrics port, 0 for none (8002)")
    gateway.add_argument("--processes", type=int, help="processes sharing the ports (1)")
    _cache(gateway)
    _torchserve(gateway)

    batcher = commands.add_parser("batcher", help="the dynamic batcher")
    _common(batcher)

    worker = commands.add_parser("worker", help="a worker pool")
    _common(worker)
    worker.add_argument("--pool", choices=["cpu", "gpu"], help="pool kind (env WEIR_WORKER_POOL)")
    worker.add_argument("--torch-threads", type=int, help="torch threads, 0 for torch's default")

    dead = commands.add_parser("dead-letters", help="list or replay dead-lettered batches")
    dead.add_argument("action", choices=["list", "replay"])
    dead.add_argument("--redis-url", help="Redis URL (env WEIR_REDIS_URL)")
    dead.add_argument("--model", help="only this model's dead letters")
    dead.add_argument("--id", dest="letter_id", help="replay only this dead letter")

    models = commands.add_parser("models", help="list, load or unload models (mode explicit)")
    models.add_argument("action", choices=["list", "load", "unload", "weights"])
    models.add_argument("names", nargs="*", help="model names (weights: MODEL VERSION=WEIGHT ...)")
    models.add_argument("--url", default="http://127.0.0.1:8000", help="a gateway's HTTP address")
    models.add_argument("--config", help="load: a config (JSON) instead of the model's file")
    models.add_argument(
        "--unload-dependents", action="store_true", help="unload: a pipeline's steps too"
    )
    models.add_argument("--token", help="the management token (env WEIR_GATEWAY_MANAGEMENT_TOKEN)")
    models.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for a call")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    options = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    if isinstance(options.get("load_model"), list):
        options["load_model"] = ",".join(options["load_model"])
    if "cache_config" in options:
        options.update(cache_options(options.pop("cache_config")))
    if "trace_config" in options:
        options.update(trace_options(options.pop("trace_config")))
    return options


def _run_up(options: dict[str, Any]) -> int:
    from weir.up_plan import UpPlan, exec_supervisor

    torchserve_flags.take(options)
    settings = UpSettings(**options)
    if settings.model_store is not None or settings.ts_config is not None or settings.models:
        from weir.torchserve.startup import prepare

        settings = prepare(settings, "repository" in options, os.environ)
    exec_supervisor(UpPlan.of(settings))  # the supervisor runs in this process, leaner
    return 0  # not reached


def _run_gateway(options: dict[str, Any]) -> int:
    settings = GatewaySettings(**options)
    if settings.model_store is not None and settings.model_control_mode is not ControlMode.EXPLICIT:
        raise ConfigError(
            "--model-store needs --model-control-mode explicit: TorchServe's management API "
            "registers and unregisters models at run time"
        )
    if settings.processes > 1:
        # prometheus-client picks its multiprocess mode when it is first imported, so the
        # directory is set here, before the gateway (and prometheus-client) is imported.
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="weir-metrics-"))
    from gateway.server import serve

    serve(settings)
    return 0


def _run_batcher(options: dict[str, Any]) -> int:
    from batcher.service import Batcher

    run(Batcher(BatcherSettings(**options)))
    return 0


def _run_dead_letters(options: dict[str, Any]) -> int:
    from weir import deadletters

    settings = ServiceSettings(**{k: v for k, v in options.items() if k in {"redis_url"}})
    return asyncio.run(
        deadletters.run(
            settings.redis_url, options["action"], options.get("model"), options.get("letter_id")
        )
    )


def _run_worker(options: dict[str, Any]) -> int:
    from workers import runtime

    runtime.apply_defaults()  # before anything imports torch
    from workers.service import Worker

    run(Worker(WorkerSettings(**options)))
    return 0


def _run_models(options: dict[str, Any]) -> int:
    from weir import models_cli

    return models_cli.run(options)


COMMANDS: dict[str, Callable[[dict[str, Any]], int]] = {
    "up": _run_up,
    "gateway": _run_gateway,
    "batcher": _run_batcher,
    "worker": _run_worker,
    "dead-letters": _run_dead_letters,
    "models": _run_models,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = _overrides(args)
    logging.basicConfig(
        level=str(options.get("log_level", "INFO")).upper(),
        format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s",
    )
    try:
        return COMMANDS[args.command](options)
    except ConfigError as exc:
        print(f"weir {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
