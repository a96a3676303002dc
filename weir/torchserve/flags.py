"""``torchserve``'s own command-line flags on ``weir up``, so that its command line runs as is.

A TorchServe user's start script (``torchserve --start --ncs --disable-token-auth
--model-store model-store --models all``) keeps its flags when ``torchserve --start``
becomes ``weir up``: those that change nothing in Weir are taken and named in the log, and
those that ask for what Weir does not do stop it with a message that says so.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from weir.errors import ConfigError

logger = logging.getLogger(__name__)

DEST = "torchserve_flags"
# Flags taken as they are, and why Weir needs none of them.
NEEDLESS = {
    "--ncs": "Weir writes no config snapshots",
    "--no-config-snapshots": "Weir writes no config snapshots",
    "--foreground": "weir up runs in the foreground",
    "--enable-model-api": "the management API is on whenever a model store is set",
    "--disable-token-auth": "no token is asked unless WEIR_GATEWAY_INFERENCE_TOKEN or "
    "WEIR_GATEWAY_MANAGEMENT_TOKEN sets one",
}
# Flags with a value, taken, and why the value is not read.
UNREAD = {
    "--log-config": "Weir logs as --log-level says",
    "--plugins-path": "Weir loads no TorchServe frontend plugins",
}
# Flags asking for what Weir does not do.
REFUSED = {
    "--workflow-store": "TorchServe's workflows are not supported; a Triton ensemble "
    "(docs/pipelines.md) chains models",
}


def add_to(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` TorchServe's flags, collected under :data:`DEST`."""
    group = parser.add_argument_group("torchserve's flags, taken so its command line runs")
    for flag, why in NEEDLESS.items():
        group.add_argument(flag, dest=DEST, action="append_const", const=flag, help=why)
    for flag, why in (UNREAD | REFUSED).items():
        group.add_argument(
            flag, dest=DEST, action="append", type=_tagged(flag), metavar="VALUE", help=why
        )


def take(options: dict[str, Any]) -> None:
    """Remove the flags from ``options``; log the needless ones, refuse the others.

    Raises:
        ConfigError: A flag asks for what Weir does not do.
    """
    for given in options.pop(DEST, None) or []:
        flag = given.split("=", 1)[0]
        if flag in REFUSED:
            raise ConfigError(f"{flag}: {REFUSED[flag]}")
        why = NEEDLESS.get(flag) or UNREAD[flag]
        logger.info("torchserve's %s is not needed: %s", given, why)


def _tagged(flag: str) -> Any:
    return lambda value: f"{flag}={value}"
