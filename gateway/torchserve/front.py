"""What the gateway holds for TorchServe's APIs: the model store, and its background loads.

TorchServe versions are strings (``1.0``); Weir's are whole numbers. A model registered
from the store maps one to the other through the store's records; a TorchServe archive
placed in a repository by hand has Weir's versions only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from weir.errors import NotFound
from weir.repository import shown
from weir.torchserve.store import ModelStore, StoreError

logger = logging.getLogger(__name__)


class TorchServeFront:
    """The model store of TorchServe's management API, and the loads it left running."""

    def __init__(self, store: ModelStore | None) -> None:
        self.store = store
        self.tasks: set[asyncio.Task[None]] = set()
        # What the store's records say, read again only when they change: a prediction
        # costs one stat of the records' directory, not a read of them.
        self._generation = -1
        self._models: frozenset[str] = frozenset()
        self._versions: dict[tuple[str, str | None], str] = {}

    def lookup(self, model: str, version: str | None) -> tuple[bool, str | None]:
        """Whether ``model`` is the store's, and the Weir version a request for it goes to.

        ``version``: TorchServe's (None: the default). One look at the store's records.
        """
        if self.store is None or model not in self._current():
            return False, version
        found = self._versions.get((model, version))
        if found is None:
            try:
                found = self.store.version_for(model, version)
            except StoreError as exc:
                raise NotFound(shown(str(exc))) from None
            self._versions[(model, version)] = found
        return True, found

    def _current(self) -> frozenset[str]:
        if self.store is None:
            return frozenset()
        generation = self.store.generation()
        if generation != self._generation:
            self._generation = generation
            self._models = frozenset(self.store.models())
            self._versions = {}
        return self._models

    def spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        """Run ``work`` after the answer (TorchServe's ``synchronous=false``), held."""

        async def logged() -> None:
            try:
                await work
            except Exception:
                logger.exception("%s failed", what)

        task = asyncio.get_running_loop().create_task(logged(), name=what)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
