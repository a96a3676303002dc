"""TorchServe's ``config.properties``: a Java properties file, read into typed settings.

Only the keys that decide how Weir serves a TorchServe deployment are typed; every other key
present is listed in :attr:`TsProperties.ignored`, for the entrypoint to name once.

A typed field is None when its key is absent: the caller then keeps Weir's own default
rather than TorchServe's (TorchServe's defaults are noted on each field).

As TorchServe, ``$$NAME$$`` in a value is replaced by the environment variable ``NAME``,
and with ``enable_envvars_config=true`` an environment variable ``TS_<KEY>`` overrides a
key. The environment is a parameter: the entrypoint passes ``os.environ``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

from weir.errors import ConfigError
from weir.torchserve.startup_models import StartupModel, load_models

_BLANK = " \t\f"
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|u|.|$)", re.DOTALL)
_ESCAPED = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_ADDRESS = re.compile(r"(?P<scheme>https?)://(?P<host>[^:/]+)(?::(?P<port>[0-9]+))?/?", re.I)
_ENV_REFERENCE = re.compile(r"\$\$([^$]+[^$])\$\$")
_ENVVARS_SWITCH = "enable_envvars_config"
# The keys of TorchServe's that an environment variable TS_<KEY> may override (TorchServe
# takes no override for `models` or `enable_envvars_config` itself).
_ENV_KEYS = (
    "inference_address",
    "management_address",
    "metrics_address",
    "model_store",
    "load_models",
    "default_workers_per_model",
    "default_response_timeout",
    "default_startup_timeout",
    "max_request_size",
    "max_response_size",
    "install_py_dep_per_model",
    "decode_input_request",
    "allowed_urls",
    "job_queue_size",
    "grpc_inference_port",
    "grpc_management_port",
)


class PropertiesError(ConfigError):
    """``config.properties`` holds a value Weir cannot use; names the file, line and key."""


class Address(NamedTuple):
    """A host and port to listen on, from an ``http://host:port`` address."""

    host: str
    port: int


@dataclass(frozen=True)
class ModelVersionSettings:
    """One model version's entry of ``models=``; None where the entry does not say."""

    default_version: bool | None = None
    mar_name: str | None = None
    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    response_timeout_s: int | None = None
    startup_timeout_s: int | None = None
    job_queue_size: int | None = None
    client_timeout_ms: int | None = None
    other: dict[str, Any] = field(default_factory=dict)


@dataclass
class TsProperties:
    """The settings of a ``config.properties`` that Weir honours.

    Attributes:
        source: Where they were read from (a path), for messages.
        inference_address: ``inference_address`` (TorchServe: ``http://127.0.0.1:8080``).
        management_address: ``management_address`` (TorchServe: ``http://127.0.0.1:8081``).
        metrics_address: ``metrics_address`` (TorchServe: ``http://127.0.0.1:8082``).
        model_store: ``model_store``; a relative path is relative to the working directory.
        load_models: ``load_models``: the listed archives, or ``"all"`` for every archive in
            the store (``standalone`` or an empty value: none).
        default_workers_per_model: ``default_workers_per_model`` (TorchServe: one per GPU,
            else one per CPU).
        default_response_timeout: ``default_response_timeout`` in seconds (TorchServe: 120).
        default_startup_timeout: ``default_startup_timeout`` in seconds (TorchServe: 120).
        models: ``models``: per model name, per version string, its settings.
        max_request_size: ``max_request_size`` in bytes (TorchServe: 6553500).
        max_response_size: ``max_response_size`` in bytes (TorchServe: 6553500).
        install_py_dep_per_model: ``install_py_dep_per_model``: install each archive's
            ``requirements.txt`` (TorchServe: false).
        decode_input_request: ``decode_input_request``: handlers get JSON and text inputs
            decoded (TorchServe: true); false, their bytes. Only exactly ``true`` is true,
            as TorchServe's workers read it.
        allowed_urls: ``allowed_urls``, the patterns an archive URL to download must match.
        job_queue_size: ``job_queue_size``, the requests each model queues (TorchServe: 100).
        grpc_inference_port: ``grpc_inference_port`` (TorchServe: 7070).
        grpc_management_port: ``grpc_management_port`` (TorchServe: 7071).
        enable_envvars_config: Whether ``TS_<KEY>`` environment variables were applied.
        ignored: Every other key present, in file order.
    """

    source: str
    inference_address: Address | None = None
    management_address: Address | None = None
    metrics_address: Address | None = None
    model_store: Path | None = None
    load_models: list[StartupModel] | Literal["all"] | None = None
    default_workers_per_model: int | None = None
    default_response_timeout: int | None = None
    default_startup_timeout: int | None = None
    models: dict[str, dict[str, ModelVersionSettings]] = field(default_factory=dict)
    max_request_size: int | None = None
    max_response_size: int | None = None
    install_py_dep_per_model: bool | None = None
    decode_input_request: bool | None = None
    allowed_urls: str | None = None
    job_queue_size: int | None = None
    grpc_inference_port: int | None = None
    grpc_management_port: int | None = None
    enable_envvars_config: bool = False
    ignored: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Entry:
    value: str
    where: str  # "file:line" or the environment variable it came from


def parse_properties(path: Path, env: Mapping[str, str] | None = None) -> TsProperties:
    """Read ``config.properties`` at ``path``; ``env`` resolves ``$$NAME$$`` and ``TS_*``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PropertiesError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")  # what Java's Properties.load reads
    return parse_properties_text(text, str(path), env)


def parse_properties_text(
    text: str, source: str, env: Mapping[str, str] | None = None
) -> TsProperties:
    """Parse the text of a ``config.properties``; ``source`` names it in messages."""
    env = env or {}
    entries = _substitute(_read_entries(text, source), env)
    switch = entries.get(_ENVVARS_SWITCH)
    enabled = switch is not None and _boolean(switch.value)
    if enabled:
        entries |= _environment_overrides(env)
    return _build(source, entries, enabled)


def _read_entries(text: str, source: str) -> dict[str, _Entry]:
    """The key/value pairs of a Java properties text (the last of a repeated key wins)."""
    entries: dict[str, _Entry] = {}
    for line, logical in _logical_lines(text):
        where = f"{source}:{line}"
        key, value = _split_entry(logical, where)
        entries[key] = _Entry(value, where)
    return entries


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) per entry: comments and blanks dropped, continuations joined."""
    lines = _LINE_BREAK.split(text)
    result: list[tuple[int, str]] = []
    index = 0
    while index < len(lines):
        start, current = index + 1, lines[index].lstrip(_BLANK)
        index += 1
        if not current or current[0] in "#!":
            continue
        while _continues(current):
            current = current[:-1]
            if index < len(lines):
                current += lines[index].lstrip(_BLANK)
                index += 1
        result.append((start, current))
    return result


def _continues(line: str) -> bool:
    # An odd run of trailing backslashes escapes the line break; an even one is literal.
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_entry(line: str, where: str) -> tuple[str, str]:
    index = 0
    while index < len(line) and line[index] not in "=:" + _BLANK:
        index += 2 if line[index] == "\\" else 1
    rest = line[index:].lstrip(_BLANK)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_BLANK)
    return _unescape(line[:index], where), _unescape(rest, where)


def _unescape(text: str, where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        escaped = match.group(1)
        if escaped == "u":
            raise PropertiesError(f"{where}: malformed \\uxxxx escape in {text!r}")
        if len(escaped) == 5:
            return chr(int(escaped[1:], 16))
        return _ESCAPED.get(escaped, escaped)

    return _ESCAPE.sub(replace, text)


def _substitute(entries: dict[str, _Entry], env: Mapping[str, str]) -> dict[str, _Entry]:
    """Replace each ``$$NAME$$`` by the environment variable ``NAME``, as TorchServe does."""

    def lookup(where: str, match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise PropertiesError(f"{where}: Invalid Environment Variable {name}")
        return env[name]

    return {
        key: _Entry(_ENV_REFERENCE.sub(partial(lookup, entry.where), entry.value), entry.where)
        for key, entry in entries.items()
    }


def _environment_overrides(env: Mapping[str, str]) -> dict[str, _Entry]:
    names = {key: f"TS_{key.upper()}" for key in _ENV_KEYS}
    return {
        key: _Entry(env[name], f"environment variable {name}")
        for key, name in names.items()
        if name in env
    }


def _build(source: str, entries: dict[str, _Entry], enabled: bool) -> TsProperties:
    values: dict[str, Any] = {}
    ignored: list[str] = []
    for key, entry in entries.items():
        reader = _READERS.get(key)
        if reader is None:
            if key != _ENVVARS_SWITCH:
                ignored.append(key)
            continue
        try:
            values[key] = reader(entry.value)
        except ValueError as exc:
            raise PropertiesError(f"{entry.where}: {key}: {exc}") from None
    return TsProperties(source=source, enable_envvars_config=enabled, ignored=ignored, **values)


def _boolean(value: str) -> bool:
    # Java's Boolean.parseBoolean: "true" in any case, and nothing else, is true.
    return value.strip().lower() == "true"


def _patterns(value: str) -> str:
    for pattern in filter(None, (p.strip() for p in value.split(","))):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is no regular expression: {exc}") from None
    return value.strip()


def _exactly_true(value: str) -> bool:
    # TorchServe hands the value as written to its workers, which decode inputs only when it
    # reads exactly "true": "True" turns decoding off there, and so here.
    return value == "true"


def _integer(value: str, minimum: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None
    if number < minimum:
        raise ValueError(f"{number} is below {minimum}")
    return number


def _address(value: str, default_port: int) -> Address:
    text = value.strip()
    if text.lower().startswith("unix:"):
        raise ValueError(f"{text!r}: unix domain sockets are not supported; use http://host:port")
    match = _ADDRESS.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an address of the form http://host:port")
    if match["scheme"].lower() == "https":
        raise ValueError(
            f"{text!r}: Weir does not serve TorchServe's APIs over TLS; use http:// and "
            "terminate TLS in front of Weir (a proxy or load balancer)"
        )
    port = int(match["port"]) if match["port"] else default_port
    if not 0 < port < 65536:
        raise ValueError(f"{text!r}: port {port} is outside 1-65535")
    return Address(match["host"], port)


def _models(value: str) -> dict[str, dict[str, ModelVersionSettings]]:
    try:
        raw = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ValueError("must be a JSON object: model name -> version -> settings")
    return {
        name: {
            str(version): _version_settings(name, str(version), settings)
            for version, settings in versions.items()
        }
        for name, versions in raw.items()
    }


_SETTINGS_INTEGERS = {
    "minWorkers": "min_workers",
    "maxWorkers": "max_workers",
    "batchSize": "batch_size",
    "maxBatchDelay": "max_batch_delay_ms",
    "responseTimeout": "response_timeout_s",
    "startupTimeout": "startup_timeout_s",
}


def _version_settings(name: str, version: str, settings: Any) -> ModelVersionSettings:
    if not isinstance(settings, dict):
        raise ValueError(f"{name} {version}: settings must be a JSON object")
    values: dict[str, Any] = {"other": {}}
    for key, value in settings.items():
        if key in _SETTINGS_INTEGERS:
            values[_SETTINGS_INTEGERS[key]] = _json_integer(name, version, key, value)
        elif key == "defaultVersion":
            values["default_version"] = _boolean(str(value))
        elif key == "marName":
            values["mar_name"] = str(value)
        else:
            values["other"][key] = value
    return ModelVersionSettings(**values)


def _json_integer(name: str, version: str, key: str, value: Any) -> int:
    # Gson's getAsInt also reads a number written as a string ("4").
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{name} {version}: {key} must be an integer, not {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} {version}: {key} must be an integer, not {value!r}") from None


_READERS: dict[str, Callable[[str], Any]] = {
    "inference_address": partial(_address, default_port=80),
    "management_address": partial(_address, default_port=8081),
    "metrics_address": partial(_address, default_port=8082),
    "model_store": lambda value: Path(value.strip()),
    "load_models": load_models,
    "default_workers_per_model": partial(_integer, minimum=0),
    "default_response_timeout": partial(_integer, minimum=1),
    "default_startup_timeout": partial(_integer, minimum=1),
    "models": _models,
    "max_request_size": partial(_integer, minimum=1),
    "max_response_size": partial(_integer, minimum=1),
    "install_py_dep_per_model": _boolean,
    "decode_input_request": _exactly_true,
    "allowed_urls": _patterns,
    "job_queue_size": partial(_integer, minimum=1),
    "grpc_inference_port": partial(_integer, minimum=0),
    "grpc_management_port": partial(_integer, minimum=0),
}
