"""Triton's ``config.pbtxt``, loaded into the same :class:`~weir.config.ModelConfig` as YAML.

The file is parsed by protobuf's ``text_format`` into the ``ModelConfig`` message that
``tritonclient[grpc]`` ships, so anything Triton's own parser rejects is rejected here with
protobuf's line and column. The message is then turned into the dict a ``config.yaml``
would hold (``json_format.MessageToDict`` with the proto field names), and from there
validation is shared with YAML: the same errors, the same top-level fields ignored with a
warning (:data:`weir.config.IGNORED_TRITON_FIELDS`).

Differences from YAML, all due to the proto form:

- 64-bit integers (``dims``, ``model_version``, ``versions``...) come out of
  ``MessageToDict`` as strings and are turned back into ints, by the field's proto type.
- A field left at its proto default (0, ``""``, ``false``, ``TYPE_INVALID``, an empty
  list) is absent, so Weir's defaults apply: ``model_version: 0`` reads as unset (``-1``,
  the latest). Empty ``dims`` are put back: a tensor's dims may be ``[]``.
- Per-tensor and per-instance-group fields that Triton repositories often carry and Weir
  does not act on (:data:`IGNORED_TENSOR_FIELDS`, :data:`IGNORED_INSTANCE_GROUP_FIELDS`)
  are dropped with a warning rather than refused.

In ``weir/``, only this module imports protobuf and ``tritonclient`` (the gateway's gRPC service
uses them too); neither pulls in torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from tritonclient.grpc import model_config_pb2

from weir.config import ModelConfig, config_from_raw
from weir.errors import ConfigError

logger = logging.getLogger(__name__)

IGNORED_TENSOR_FIELDS = frozenset(
    {
        "format",
        "reshape",
        "is_shape_tensor",
        "is_non_linear_format_io",
    }
)
IGNORED_INSTANCE_GROUP_FIELDS = frozenset(
    {"profile", "passive", "host_policy", "secondary_devices", "rate_limiter"}
)

_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def load_pbtxt(path: Path, default_name: str) -> ModelConfig:
    """Parse one ``config.pbtxt``; every problem raises ConfigError naming file and field."""
    return config_from_raw(read_pbtxt(path), path, default_name)


def read_pbtxt(path: Path) -> dict[str, Any]:
    """One ``config.pbtxt`` as the dict its YAML would hold, fields Weir ignores dropped."""
    raw = pbtxt_to_raw(path)
    for field in ("input", "output"):
        _drop_ignored(path, raw, field, IGNORED_TENSOR_FIELDS)
        for tensor in raw.get(field, ()):
            tensor.setdefault("dims", [])  # absent in proto JSON when empty
    _drop_ignored(path, raw, "instance_group", IGNORED_INSTANCE_GROUP_FIELDS)
    return raw


def pbtxt_to_raw(path: Path) -> dict[str, Any]:
    """The config as the dict its ``config.yaml`` would hold (field names and enum names)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from exc
    message = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigError(_parse_error(path, exc)) from None
    raw = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return _with_ints(message.DESCRIPTOR, raw)


def _parse_error(path: Path, exc: text_format.ParseError) -> str:
    line, column = exc.GetLine(), exc.GetColumn()
    if line is None:
        return f"{path}: {exc}"
    return f"{path}:{line}:{column}: {str(exc).removeprefix(f'{line}:{column} : ')}"


def _with_ints(descriptor: Descriptor, raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with every 64-bit integer field (a string in proto JSON) back as an int."""
    fields = descriptor.fields_by_name
    return {key: _value_with_ints(fields[key], value) for key, value in raw.items()}


def _value_with_ints(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        return {k: _value_with_ints(value_field, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scalar_with_ints(field, item) for item in value]
    return _scalar_with_ints(field, value)


def _scalar_with_ints(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return _with_ints(field.message_type, value)
    if field.type in _INT64_TYPES:
        return int(value)
    return value


def _drop_ignored(path: Path, raw: dict[str, Any], field: str, ignored: frozenset[str]) -> None:
    for index, entry in enumerate(raw.get(field, ())):
        for key in sorted(ignored.intersection(entry)):
            logger.warning(
                "%s: field %s[%d].%s is not supported yet and is ignored", path, field, index, key
            )
            entry.pop(key)
