"""``weir up`` as ``torchserve --start``: a model store, its archives, ``config.properties``.

:func:`prepare` turns TorchServe's start options into Weir's: ``config.properties``' keys
fill what the command line did not set (the command line wins, as TorchServe's does), the
store's registrations of an earlier run are forgotten (TorchServe starts with only the
models it is told to load), the archives to serve are registered into the generated
repository (``<model store>/.weir`` unless ``--repository`` names one), and the mesh runs in
model control mode explicit with those models loaded at start, so that TorchServe's
management API can register and unregister others.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from weir.control.mode import ControlMode
from weir.errors import ConfigError
from weir.torchserve.download import Downloads
from weir.torchserve.properties import ModelVersionSettings, TsProperties, parse_properties
from weir.torchserve.startup_models import StartupModel, load_models
from weir.torchserve.store import ModelStore
from weir.up_settings import UpSettings

logger = logging.getLogger(__name__)

GENERATED_REPOSITORY = ".weir"


def prepare(settings: UpSettings, repository_given: bool, env: Mapping[str, str]) -> UpSettings:
    """``settings`` with TorchServe's options applied and the start models registered."""
    properties = _properties(settings, env)
    settings = settings.model_copy(update=_from_properties(settings, properties))
    if settings.model_store is None:
        raise ConfigError(
            "--models needs a model store: --model-store DIR, or model_store in config.properties"
        )
    repository = settings.repository if repository_given else _generated(settings.model_store)
    downloads = Downloads.of(
        settings.ts_allowed_urls, settings.ts_max_download_bytes, settings.ts_download_timeout_s
    )
    store = ModelStore(settings.model_store, repository, downloads)
    forgotten = store.reset()
    if forgotten:
        logger.info("forgot the registrations of an earlier run: %s", ", ".join(forgotten))
    names = _register(store, settings, properties)
    return settings.model_copy(
        update={
            "repository": repository,
            "model_control_mode": ControlMode.EXPLICIT,
            "load_model": ",".join(names),
        }
    )


def _properties(settings: UpSettings, env: Mapping[str, str]) -> TsProperties:
    if settings.ts_config is None:
        return TsProperties(source="")
    properties = parse_properties(settings.ts_config, env)
    if properties.ignored:
        logger.warning(
            "%s: keys Weir ignores: %s", properties.source, ", ".join(properties.ignored)
        )
    return properties


def _from_properties(settings: UpSettings, properties: TsProperties) -> dict[str, Any]:
    """What ``config.properties`` sets that the command line and environment did not."""
    given = settings.model_fields_set
    candidates: dict[str, Any] = {
        "model_store": properties.model_store,
        "http_port": properties.inference_address and properties.inference_address.port,
        "ts_management_port": properties.management_address and properties.management_address.port,
        "ts_management_host": properties.management_address and properties.management_address.host,
        "metrics_port": properties.metrics_address and properties.metrics_address.port,
        "ts_default_workers_per_model": properties.default_workers_per_model,
        "ts_default_response_timeout_s": properties.default_response_timeout,
        "ts_default_startup_timeout_s": properties.default_startup_timeout,
        "ts_max_request_size_bytes": properties.max_request_size,
        "ts_max_response_size_bytes": properties.max_response_size,
        "ts_install_requirements": properties.install_py_dep_per_model,
        "ts_decode_input_request": properties.decode_input_request,
        "ts_allowed_urls": properties.allowed_urls,
        "ts_job_queue_size": properties.job_queue_size,
        "ts_grpc_inference_port": properties.grpc_inference_port,
        "ts_grpc_management_port": properties.grpc_management_port,
    }
    return {k: v for k, v in candidates.items() if v is not None and k not in given}


def _generated(model_store: Path) -> Path:
    path = model_store / GENERATED_REPOSITORY
    path.mkdir(parents=True, exist_ok=True)
    return path


def _startup_models(
    store: ModelStore, settings: UpSettings, properties: TsProperties
) -> list[StartupModel]:
    """``--models`` (or ``load_models``): the named archives, or every one for ``all``.

    As in TorchServe, ``--models`` items may each hold several, separated by commas.
    """
    listed = properties.load_models
    if settings.models:
        try:
            listed = "all" if "all" in settings.models else load_models(",".join(settings.models))
        except ValueError as exc:
            raise ConfigError(f"--models: {exc}") from None
    if listed == "all":
        return [StartupModel(url) for url in store.archives()]
    return list(listed or [])


def _register(store: ModelStore, settings: UpSettings, properties: TsProperties) -> list[str]:
    """Register the start models; the names of those with workers to load."""
    names: list[str] = []
    for model in _startup_models(store, settings, properties):
        registration = store.register(
            model.url,
            model_name=model.name,
            default_workers=settings.ts_default_workers_per_model or None,
            default_response_timeout_s=settings.ts_default_response_timeout_s,
            default_startup_timeout_s=settings.ts_default_startup_timeout_s,
            default_job_queue_size=settings.ts_job_queue_size,
            startup=True,
            defaults=_model_settings(properties, model),
        )
        logger.info(
            'registered "%s" version %s from %s',
            registration.name,
            registration.ts_version,
            registration.url,
        )
        if settings.ts_default_workers_per_model and registration.name not in names:
            names.append(registration.name)
    return names


def _model_settings(properties: TsProperties, model: StartupModel) -> ModelVersionSettings | None:
    """``config.properties``' ``models=`` entry for a start model: by archive, else by name."""
    for name, versions in properties.models.items():
        for settings in versions.values():
            if settings.mar_name == model.url or (model.name == name and len(versions) == 1):
                return settings
    return None
