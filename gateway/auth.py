"""Optional bearer-token authentication: one token for inference, one for management.

The same tokens guard HTTP and gRPC (the ``authorization`` metadata entry). Health and
server metadata stay open (probes and load balancers need them). Management routes take
the management token when one is set, else the inference token. With no token set, every
route is open, and the gateway says so when it starts.
"""

from __future__ import annotations

import hmac
from enum import StrEnum

from fastapi import Request

from gateway.state import gateway_state
from weir.errors import Unauthorized
from weir.settings import GatewaySettings


class Scope(StrEnum):
    """What a route does, for choosing the token it needs."""

    INFERENCE = "inference"
    MANAGEMENT = "management"


def required_token(settings: GatewaySettings, scope: Scope) -> str | None:
    token = settings.inference_token
    if scope is Scope.MANAGEMENT and settings.management_token is not None:
        token = settings.management_token
    return None if token is None else token.get_secret_value()


def check_token(request: Request, scope: Scope) -> None:
    """Raise Unauthorized unless the request carries the token ``scope`` needs."""
    token = required_token(gateway_state(request).settings, scope)
    if token is not None:
        check_authorization(request.headers.get("authorization", ""), token, scope)


def check_authorization(authorization: str, token: str, scope: Scope) -> None:
    """Raise Unauthorized unless ``authorization`` is ``Bearer <token>``.

    ``authorization`` is the HTTP header's value, or the gRPC metadata entry's.
    """
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized(f"this {scope.value} route needs a valid bearer token")


async def inference_scope(request: Request) -> None:
    check_token(request, Scope.INFERENCE)


async def management_scope(request: Request) -> None:
    check_token(request, Scope.MANAGEMENT)
