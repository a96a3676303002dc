"""The model store's errors, each carrying the HTTP status TorchServe answers it with."""

from __future__ import annotations

from weir.errors import ConfigError


class StoreError(ConfigError):
    """A model store request that cannot be done; ``http_status`` as TorchServe's (400)."""

    http_status = 400


class StoreNotFound(StoreError):
    """An unknown model, version or archive (404)."""

    http_status = 404


class StoreConflict(StoreError):
    """The model version is registered already (409)."""

    http_status = 409


class StoreForbidden(StoreError):
    """Removing the default version while others remain (403, as TorchServe)."""

    http_status = 403
