"""The gateway's gRPC endpoint: a ``grpc.aio`` server in the gateway's own event loop.

The lifespan (:func:`gateway.app.create_app`) starts it once the gateway's state is built
and stops it before that state is torn down. A message over the body limit is refused by
gRPC itself (RESOURCE_EXHAUSTED, naming both sizes) before any of it is parsed.

One gateway process binds the port alone, so a port already taken fails start-up, as
Triton's does. With several processes (``processes`` > 1) each binds the same port with
``SO_REUSEPORT`` and the kernel spreads connections over them, as the HTTP port's shared
socket does for HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from tritonclient.grpc import service_pb2_grpc

from gateway.grpc_service import InferenceServicer
from gateway.state import GatewayState
from weir.settings import GatewaySettings

logger = logging.getLogger(__name__)

# gRPC channel arguments are C ints.
MAX_MESSAGE_BYTES = 2**31 - 1


KEEPALIVE_TIMEOUT_MS = 20_000


def server_options(settings: GatewaySettings) -> list[tuple[str, int]]:
    """The channel arguments of gRPC: message size, and the limits a hostile client meets.

    A connection must finish its HTTP/2 handshake within the HTTP head timeout (gRPC's own
    default is 120 s, time enough to exhaust descriptors with silent connections), is closed
    when idle, and is pinged so that a dead peer's connection goes.
    """
    return [
        ("grpc.max_receive_message_length", min(settings.body_limit_bytes, MAX_MESSAGE_BYTES)),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", int(settings.processes > 1)),
        ("grpc.server_handshake_timeout_ms", _ms(settings.header_timeout_s)),
        ("grpc.max_connection_idle_ms", _ms(settings.grpc_max_connection_idle_s)),
        ("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams),
        ("grpc.keepalive_time_ms", _ms(settings.grpc_keepalive_s)),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ]


def _ms(seconds: float) -> int:
    return min(int(seconds * 1000), MAX_MESSAGE_BYTES)


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """Serves :class:`~gateway.grpc_service.InferenceServicer` on the gRPC port."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        settings = state.settings
        self.address = bind_address(settings.host, settings.grpc_port)
        self.server: Any = None
        self._stopping: asyncio.Future[None] | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server(options=server_options(self.state.settings))
        servicer = InferenceServicer(self.state)
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, self.server)
        try:
            self.server.add_insecure_port(self.address)
        except RuntimeError:
            raise OSError(
                f"cannot serve gRPC on {self.address}: the port is taken or the address is "
                "not this host's (WEIR_GATEWAY_GRPC_PORT picks another port, 0 turns gRPC off)"
            ) from None
        await self.server.start()
        logger.info("serving KServe v2 gRPC on %s", self.address)

    def drain(self) -> None:
        """Stop taking calls and let those in flight finish, up to the grace period."""
        if self._stopping is None and self.server is not None:
            grace_s = self.state.settings.shutdown_grace_s
            self._stopping = asyncio.ensure_future(self.server.stop(grace_s))

    async def stop(self) -> None:
        """Drain, if nothing began it yet, and wait until the server has stopped."""
        self.drain()
        if self._stopping is not None:
            await self._stopping
