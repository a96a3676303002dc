"""Importing and initializing a TorchServe archive's handler, as TorchServe's loader does.

``x.py``, ``x`` or ``x:function`` names a file of the archive, any other name a built-in
handler of ``ts.torch_handler``. A module with the function (``handle`` by default) is a
function entry point, initialized by ``handle(None, context)``; otherwise the one class the
module defines is built with no arguments and ``initialize(context)`` is called. The
imports are isolated per archive (:func:`archive_imports`; the backend's module docstring
says why and what it costs).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from weir.errors import ConfigError
from weir.torchserve import archive
from workers.backends.torchserve_context import Context
from workers.backends.torchserve_requirements import add_to_path, install

logger = logging.getLogger(__name__)

BUILTIN_PACKAGE = "ts.torch_handler"
TS_INSTALL = "pip install 'weir[torchserve]'"
# Modules whose pip package has another name.
PIP_NAMES = {"PIL": "pillow", "cv2": "opencv-python", "yaml": "pyyaml", "sklearn": "scikit-learn"}
PYTHON_RUNTIMES = ("python", "python3")

# sys.path and sys.modules are the process's: one archive at a time imports through them.
_IMPORT_LOCK = threading.RLock()
_LOADS = itertools.count()
_MODULE_PREFIX = "weir_torchserve_"  # of each handler module's name, unique to its load
_TOLD_REQUIREMENTS: set[Path] = set()
# What TorchServe's backend reads, per request, to decode JSON and text inputs or not.
DECODE_ENV = "TS_DECODE_INPUT_REQUEST"


@dataclass(frozen=True)
class EntryPoint:
    """A loaded handler: what runs each batch, and the module that keeps it alive."""

    handle: Callable[[Any, Any], Any]
    initialize: Callable[[Any], Any]
    module: ModuleType
    name: str


class HandlerLoader:
    """Imports and initializes one archive's handler, as TorchServe's model loader does."""

    def __init__(
        self,
        model: str,
        path: Path,
        model_dir: Path,
        manifest: archive.Manifest,
        install_requirements: bool = False,
    ) -> None:
        self.install_requirements = install_requirements
        self.model = model
        self.path = path
        self.model_dir = model_dir
        self.manifest = manifest
        self.handler = manifest.handler
        # Whether the handler turned input decoding on or off as it loaded; None: it did not.
        self.decode_input: bool | None = None

    def load(self, context: Context) -> EntryPoint:
        """The handler's entry point, initialized with ``context``."""
        if self.manifest.runtime not in PYTHON_RUNTIMES:
            raise ConfigError(
                f"{self.path}: runtime {self.manifest.runtime!r} is not served "
                f"(only {', '.join(PYTHON_RUNTIMES)})"
            )
        self._requirements()
        module_name, _, function_name = self.handler.partition(":")
        module_name = module_name.removesuffix(".py").split("/")[-1]
        with archive_imports(self.model_dir, skip=f"{module_name}.py"), self._decoding():
            module = self._import(module_name)
            entry = self._entry_point(module, function_name or "handle")
            self._initialize(entry, context)
        return entry

    @contextmanager
    def _decoding(self) -> Iterator[None]:
        """Note a handler's own ``TS_DECODE_INPUT_REQUEST``, then put the environment back.

        TorchServe's backend reads it from the process environment for every request, and
        handlers set it as they load to parse their inputs themselves. A Weir worker hosts
        many archives in one process, so the value a handler sets is that archive's choice
        (:attr:`decode_input`), and the next archive loads in the environment as it was.
        Reading the environment here is TorchServe's handler contract, not a Weir setting.
        """
        before = os.environ.get(DECODE_ENV)
        try:
            yield
            after = os.environ.get(DECODE_ENV)
            if after != before:  # TorchServe decodes when it is unset or exactly "true"
                self.decode_input = after is None or after == "true"
        finally:
            if before is None:
                os.environ.pop(DECODE_ENV, None)
            else:
                os.environ[DECODE_ENV] = before

    def _import(self, module_name: str) -> ModuleType:
        file = self.model_dir / f"{module_name}.py"
        try:
            if file.is_file():
                return _import_file(self.model, file)
            return self._import_builtin(module_name)
        except ModuleNotFoundError as exc:
            raise self._missing(exc, "file" if file.is_file() else "built-in") from exc
        except ConfigError:
            raise
        except Exception as exc:
            logger.exception("model %s: importing handler %s failed", self.model, self.handler)
            raise ConfigError(
                f"model '{self.model}': importing handler {self.handler!r} of {self.path} "
                f"failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _import_builtin(self, module_name: str) -> ModuleType:
        if importlib.util.find_spec("ts") is None:
            raise ConfigError(
                f"model '{self.model}': handler {self.handler!r} needs TorchServe's 'ts' "
                f"package: {TS_INSTALL} (no file of the archive has that name, so it is "
                "one of TorchServe's built-in handlers)"
            )
        if importlib.util.find_spec(f"{BUILTIN_PACKAGE}.{module_name}") is None:
            raise ConfigError(
                f"model '{self.model}': handler {self.handler!r} is neither a file of "
                f"{self.path} nor a TorchServe built-in handler"
            )
        return importlib.import_module(f"{BUILTIN_PACKAGE}.{module_name}")

    def _missing(self, exc: ModuleNotFoundError, kind: str) -> ConfigError:
        missing = (exc.name or "").split(".")[0]
        if missing == "ts":
            return ConfigError(
                f"model '{self.model}': handler {self.handler!r} needs TorchServe's 'ts' "
                f"package: {TS_INSTALL} (missing module '{exc.name}')"
            )
        note = ""
        if self.manifest.requirements_file:
            note = f" (the archive's {self.manifest.requirements_file} is not installed by Weir)"
        return ConfigError(
            f"model '{self.model}': handler {self.handler!r} ({kind}) needs the package "
            f"'{missing}', which is not installed: pip install {PIP_NAMES.get(missing, missing)}"
            f"{note}"
        )

    def _entry_point(self, module: ModuleType, function_name: str) -> EntryPoint:
        function = getattr(module, function_name, None)
        if function is not None:
            return EntryPoint(
                function, lambda context: function(None, context), module, function_name
            )
        classes = [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__
        ]
        if len(classes) != 1:
            names = ", ".join(cls.__name__ for cls in classes) or "none"
            raise ConfigError(
                f"model '{self.model}': handler {self.handler!r} must define one class or a "
                f"function {function_name}() (classes: {names})"
            )
        return self._class_entry_point(module, classes[0])

    def _class_entry_point(self, module: ModuleType, cls: type[Any]) -> EntryPoint:
        try:
            service = cls()
        except Exception as exc:
            raise self._failed(f"{cls.__name__}()", exc) from exc
        for method in ("handle", "initialize"):
            if not callable(getattr(service, method, None)):
                raise ConfigError(
                    f"model '{self.model}': handler class {cls.__name__} has no {method} method"
                )
        return EntryPoint(service.handle, service.initialize, module, cls.__name__)

    def _initialize(self, entry: EntryPoint, context: Context) -> None:
        try:
            entry.initialize(context)
        except Exception as exc:
            raise self._failed("initialize", exc) from exc

    def _failed(self, step: str, exc: Exception) -> ConfigError:
        logger.error(
            "model %s: handler %s: %s failed", self.model, self.handler, step, exc_info=exc
        )
        return ConfigError(
            f"model '{self.model}': handler {self.handler!r} of {self.path}: {step} failed: "
            f"{type(exc).__name__}: {exc}"
        )

    def _requirements(self) -> None:
        file = self.manifest.requirements_file
        if file and self.install_requirements:
            add_to_path(install(self.model, self.model_dir, file))
        elif file and self.model_dir not in _TOLD_REQUIREMENTS:
            _TOLD_REQUIREMENTS.add(self.model_dir)
            logger.info(
                "model %s: Weir does not install the archive's %s: its packages must be in "
                "the worker's environment (or set WEIR_WORKER_TS_INSTALL_REQUIREMENTS=true)",
                self.model,
                file,
            )


def _import_file(model: str, file: Path) -> ModuleType:
    """Import a handler file under a module name of its own for every load."""
    safe_name = re.sub(r"\W", "_", f"{model}_{file.stem}")
    module_name = f"{_MODULE_PREFIX}{safe_name}_{next(_LOADS)}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{file}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # as an import would, so dataclasses and pickle work
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


@contextmanager
def archive_imports(model_dir: Path, skip: str = "") -> Iterator[None]:
    """Import from ``model_dir`` first; then forget the modules that came from there.

    The handler's own module (a name unique to its load) stays in ``sys.modules``; ``skip``
    names its file, which no module of the process can shadow.
    """
    root = str(model_dir)
    with _IMPORT_LOCK:
        _log_shadowed(model_dir, skip)
        before = set(sys.modules)
        sys.path.insert(0, root)
        importlib.invalidate_caches()
        try:
            yield
        finally:
            sys.path.remove(root)
            _forget(set(sys.modules) - before, root)


def _forget(names: set[str], root: str) -> None:
    for name in names:
        module = sys.modules.get(name)
        if not name.startswith(_MODULE_PREFIX) and module and _loaded_from(module, root):
            del sys.modules[name]


def _loaded_from(module: ModuleType, root: str) -> bool:
    file = getattr(module, "__file__", None)
    locations = [file] if file else list(getattr(module, "__path__", None) or [])
    return any(str(location).startswith(root + os.sep) for location in locations)


def _log_shadowed(model_dir: Path, skip: str) -> None:
    """Say which of the archive's top-level modules a module imported before hides."""
    for child in model_dir.iterdir():
        if child.name == skip:
            continue
        name = child.stem if child.suffix == ".py" else child.name
        module = sys.modules.get(name)
        if module is not None and (child.suffix == ".py" or (child / "__init__.py").is_file()):
            logger.warning(
                "%s: the archive's %s is not imported: module %s is already loaded from %s",
                model_dir,
                child.name,
                name,
                getattr(module, "__file__", None) or "elsewhere",
            )
