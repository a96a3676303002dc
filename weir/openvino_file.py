"""The signature of an OpenVINO IR (``model.xml`` + ``model.bin``), read without OpenVINO.

The IR's XML lists the model's inputs as ``Parameter`` layers (element type and shape in
``<data>``, tensor names in the output port's ``names``) and its outputs as ``Result``
layers (the port's precision and dims; the tensor name in ``output_names`` since IR v11,
else the ``names`` of the producing port an ``<edge>`` leads from). A dynamic dimension is
``-1`` or ``?`` and a bounded one ``1..8``; both read as -1. The weights in ``model.bin`` are
not read, only required to exist.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from weir.errors import ConfigError
from weir.signature import ModelSignature, TensorSignature

# OpenVINO element types (``element_type``) and precisions (port ``precision``) -> KServe.
OPENVINO_DATATYPES: dict[str, str] = {
    "f32": "FP32",
    "f16": "FP16",
    "bf16": "BF16",
    "f64": "FP64",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "boolean": "BOOL",
    "string": "BYTES",
}
PRECISIONS: dict[str, str] = {
    **{name.upper(): kserve for name, kserve in OPENVINO_DATATYPES.items()},
    "FP32": "FP32",
    "FP16": "FP16",
    "FP64": "FP64",
    "BOOL": "BOOL",
}


def weights_file(xml_path: Path) -> Path:
    return xml_path.with_suffix(".bin")


def read_openvino_signature(path: Path) -> ModelSignature:
    """The inputs and outputs of the IR at ``path``; ConfigError naming the reason."""
    if not weights_file(path).is_file():
        raise ConfigError(f"{path}: its weights file {weights_file(path).name} is missing")
    try:
        net = ET.parse(path).getroot()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the model: {exc}") from exc
    except ET.ParseError as exc:
        raise ConfigError(f"{path}: not a valid OpenVINO IR: {exc}") from None
    layers = net.find("layers")
    if net.tag != "net" or layers is None:
        raise ConfigError(f"{path}: not an OpenVINO IR (no <net> with <layers>)")
    by_id = {layer.get("id", ""): layer for layer in layers.iter("layer")}
    sources = _edge_sources(net)
    inputs = tuple(_parameter(p) for p in layers.iter("layer") if p.get("type") == "Parameter")
    outputs = tuple(
        _result(r, by_id, sources) for r in layers.iter("layer") if r.get("type") == "Result"
    )
    if not outputs:
        raise ConfigError(f"{path}: not an OpenVINO IR (it has no Result layer)")
    return ModelSignature(path, inputs, outputs)


def _edge_sources(net: ET.Element) -> dict[str, tuple[str, str]]:
    """Each consuming layer id -> the (layer id, port id) its first input comes from."""
    sources: dict[str, tuple[str, str]] = {}
    for edge in net.iter("edge"):
        sources.setdefault(
            edge.get("to-layer", ""), (edge.get("from-layer", ""), edge.get("from-port", ""))
        )
    return sources


def _parameter(layer: ET.Element) -> TensorSignature:
    data = layer.find("data")
    element_type = data.get("element_type", "") if data is not None else ""
    datatype = OPENVINO_DATATYPES.get(element_type, f"<{element_type or 'undefined'}>")
    shape = data.get("shape") if data is not None else None
    port = layer.find("output/port")
    name = _first_name(port) or layer.get("name", "")
    dims = _shape(shape) if shape is not None else _port_dims(port)
    return TensorSignature(name, datatype, dims)


def _result(
    layer: ET.Element, by_id: dict[str, ET.Element], sources: dict[str, tuple[str, str]]
) -> TensorSignature:
    port = layer.find("input/port")
    precision = port.get("precision", "") if port is not None else ""
    datatype = PRECISIONS.get(precision, f"<{precision or 'undefined'}>")
    name = _split_names(layer.get("output_names", "")) or _producer_name(layer, by_id, sources)
    return TensorSignature(name or layer.get("name", ""), datatype, _port_dims(port))


def _producer_name(
    layer: ET.Element, by_id: dict[str, ET.Element], sources: dict[str, tuple[str, str]]
) -> str:
    source = sources.get(layer.get("id", ""))
    if source is None or source[0] not in by_id:
        return ""
    for port in by_id[source[0]].iterfind("output/port"):
        if port.get("id") == source[1]:
            return _first_name(port)
    return ""


def _first_name(port: ET.Element | None) -> str:
    return _split_names(port.get("names", "")) if port is not None else ""


def _split_names(names: str) -> str:
    # A port may carry several tensor names, comma-separated (a literal comma is "\,").
    first = names.replace("\\,", "\0").split(",")[0]
    return first.replace("\0", ",").strip()


def _shape(text: str) -> tuple[int, ...] | None:
    if text.strip() == "...":
        return None  # dynamic rank
    return tuple(_dim(d) for d in text.split(",") if d.strip())


def _dim(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else -1


def _port_dims(port: ET.Element | None) -> tuple[int, ...] | None:
    if port is None:
        return None
    return tuple(_dim(d.text or "") for d in port.iterfind("dim"))
