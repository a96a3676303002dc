"""Configs filled from ONNX and OpenVINO models, and checked against them, at load time.

Real model files: ONNX models built with onnx.helper, OpenVINO IR converted from them by
openvino itself. The loader reads them without either runtime (the gateway has neither).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.weir import onnx_models
from weir.completion import Completion
from weir.errors import ConfigError
from weir.repository import Repository


def onnx_model(root: Path, name: str, model: object, filename: str = "model.onnx") -> Path:
    return onnx_models.save(model, root / name / "1" / filename)  # type: ignore[arg-type]


def write(root: Path, name: str, text: str, filename: str = "config.pbtxt") -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / filename).write_text(text)


def test_a_model_with_no_config_is_completed_as_triton_does(tmp_path: Path) -> None:
    onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    config = Repository.load(tmp_path).models["addsub"].config
    assert config.backend.value == "onnxruntime"
    # Every tensor has a dynamic first dimension: it batches, by Triton's default of 4.
    assert config.max_batch_size == 4
    assert config.dynamic_batching is not None
    assert [(t.name, t.datatype, t.dims) for t in config.input] == [
        ("INPUT0", "FP32", (4,)),
        ("INPUT1", "FP32", (4,)),
    ]
    assert [(t.name, t.datatype, t.dims) for t in config.output] == [
        ("OUTPUT0", "FP32", (4,)),
        ("OUTPUT1", "FP32", (4,)),
    ]


def test_the_default_max_batch_size_is_a_setting(tmp_path: Path) -> None:
    onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    repository = Repository.load(tmp_path, Completion(default_max_batch_size=16))
    config = repository.models["addsub"].config
    assert config.max_batch_size == 16


def test_a_model_with_fixed_dims_does_not_batch(tmp_path: Path) -> None:
    onnx_model(tmp_path, "fixed", onnx_models.identity("INT32", (2, 3)))
    config = Repository.load(tmp_path).models["fixed"].config
    assert config.max_batch_size == 0
    assert config.dynamic_batching is None
    assert config.input[0].dims == (2, 3)


def test_a_partial_config_keeps_what_it_gives(tmp_path: Path) -> None:
    onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    write(
        tmp_path,
        "addsub",
        'name: "addsub"\nbackend: "onnxruntime"\nmax_batch_size: 32\n'
        "instance_group [{ count: 2, kind: KIND_CPU }]\n",
    )
    config = Repository.load(tmp_path).models["addsub"].config
    assert config.max_batch_size == 32
    assert config.instance_group[0].count == 2
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]


def test_given_outputs_are_kept_and_inputs_filled(tmp_path: Path) -> None:
    onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    write(
        tmp_path,
        "addsub",
        "name: addsub\nplatform: onnxruntime_onnx\nmax_batch_size: 8\n"
        "output: [{name: OUTPUT1, data_type: TYPE_FP32, dims: [4]}]\n",
        "config.yaml",
    )
    config = Repository.load(tmp_path).models["addsub"].config
    assert [t.name for t in config.output] == ["OUTPUT1"]
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]


def test_max_batch_size_on_a_model_that_cannot_batch_is_refused(tmp_path: Path) -> None:
    path = onnx_model(tmp_path, "fixed", onnx_models.identity("FP32", (2, 3)))
    write(tmp_path, "fixed", 'name: "fixed"\nbackend: "onnxruntime"\nmax_batch_size: 8\n')
    with pytest.raises(ConfigError, match="cannot batch") as info:
        Repository.load(tmp_path)
    assert str(path) in str(info.value)


def test_default_model_filename_is_honoured(tmp_path: Path) -> None:
    onnx_model(tmp_path, "named", onnx_models.add_sub(), "addsub.onnx")
    write(
        tmp_path,
        "named",
        'name: "named"\nbackend: "onnxruntime"\ndefault_model_filename: "addsub.onnx"\n',
    )
    entry = Repository.load(tmp_path).models["named"]
    assert entry.config.default_model_filename == "addsub.onnx"
    assert [t.name for t in entry.config.input] == ["INPUT0", "INPUT1"]


def test_default_model_filename_cannot_leave_the_version_directory(tmp_path: Path) -> None:
    onnx_model(tmp_path, "named", onnx_models.add_sub())
    write(
        tmp_path, "named", 'name: "named"\nbackend: "onnxruntime"\ndefault_model_filename: "../x"\n'
    )
    with pytest.raises(ConfigError, match="default_model_filename"):
        Repository.load(tmp_path)


FULL = """name: "addsub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{ name: "{input_name}", data_type: {data_type}, dims: {dims} }},
  {{ name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }}
]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
"""


def full_config(
    input_name: str = "INPUT0", data_type: str = "TYPE_FP32", dims: str = "[ 4 ]"
) -> str:
    return FULL.format(input_name=input_name, data_type=data_type, dims=dims)


def test_a_full_config_that_matches_the_model_loads(tmp_path: Path) -> None:
    onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    write(tmp_path, "addsub", full_config())
    config = Repository.load(tmp_path).models["addsub"].config
    assert [t.name for t in config.output] == ["OUTPUT0"]  # a subset of outputs is fine


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"input_name": "IN0"}, ["'IN0'", "INPUT0, INPUT1"]),
        ({"data_type": "TYPE_INT32"}, ["'INPUT0'", "TYPE_INT32", "TYPE_FP32"]),
        ({"dims": "[ 4, 1 ]"}, ["'INPUT0'", "rank 3 in the config, rank 2", "[-1, 4, 1]"]),
        ({"dims": "[ 5 ]"}, ["'INPUT0'", "[-1, 5]", "[-1, 4]"]),
    ],
    ids=["name", "datatype", "rank", "dims"],
)
def test_a_config_that_disagrees_with_the_model_stops_loading(
    tmp_path: Path, change: dict[str, str], expected: list[str]
) -> None:
    path = onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    write(tmp_path, "addsub", full_config(**change))
    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    message = str(info.value)
    assert str(path) in message and "config.pbtxt" in message
    for part in expected:
        assert part in message, message


def test_a_model_input_missing_from_the_config_stops_loading(tmp_path: Path) -> None:
    onnx_model(tmp_path, "addsub", onnx_models.add_sub())
    write(
        tmp_path,
        "addsub",
        "name: addsub\nbackend: onnxruntime\nmax_batch_size: 8\n"
        "input: [{name: INPUT0, data_type: TYPE_FP32, dims: [4]}]\n"
        "output: [{name: OUTPUT0, data_type: TYPE_FP32, dims: [4]}]\n",
        "config.yaml",
    )
    with pytest.raises(ConfigError, match="takes input 'INPUT1'"):
        Repository.load(tmp_path)


def test_every_served_version_is_checked(tmp_path: Path) -> None:
    onnx_model(tmp_path, "m", onnx_models.add_sub())
    v2 = onnx_models.save(onnx_models.identity("INT64"), tmp_path / "m" / "2" / "model.onnx")
    write(tmp_path, "m", 'name: "m"\nbackend: "onnxruntime"\nversion_policy: { all: {} }\n')
    # Filled from version 2, the latest; version 1 is a different model.
    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    assert str(tmp_path / "m" / "1" / "model.onnx") in str(info.value)
    assert v2.exists()


def test_a_corrupt_model_file_names_the_file_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x0f\xff\xff\xff this is not protobuf")
    with pytest.raises(ConfigError, match="not a valid ONNX model") as info:
        Repository.load(tmp_path)
    assert str(path) in str(info.value)


def test_a_truncated_model_file_is_reported_as_truncated(tmp_path: Path) -> None:
    path = onnx_model(tmp_path, "cut", onnx_models.add_sub())
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ConfigError, match="truncated"):
        Repository.load(tmp_path)


def test_a_missing_model_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty" / "1").mkdir(parents=True)
    write(tmp_path, "empty", 'name: "empty"\nbackend: "onnxruntime"\n')
    with pytest.raises(ConfigError, match=r"model\.onnx"):
        Repository.load(tmp_path)


def test_a_directory_with_neither_config_nor_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "nothing" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no config\.yaml or config\.pbtxt"):
        Repository.load(tmp_path)


def openvino_ir(root: Path, name: str, model: object) -> Path:
    import openvino as ov

    onnx_path = onnx_models.save(model, root / ".sources" / f"{name}.onnx")  # type: ignore[arg-type]
    xml = root / name / "1" / "model.xml"
    xml.parent.mkdir(parents=True)
    ov.save_model(ov.convert_model(str(onnx_path)), str(xml), compress_to_fp16=False)
    return xml


def test_an_openvino_ir_with_no_config_is_completed(tmp_path: Path) -> None:
    openvino_ir(tmp_path, "addsub_ov", onnx_models.add_sub())
    config = Repository.load(tmp_path).models["addsub_ov"].config
    assert config.backend.value == "openvino"
    assert config.max_batch_size == 4
    assert sorted((t.name, t.datatype, t.dims) for t in config.input) == [
        ("INPUT0", "FP32", (4,)),
        ("INPUT1", "FP32", (4,)),
    ]
    assert sorted(t.name for t in config.output) == ["OUTPUT0", "OUTPUT1"]


def test_an_openvino_ir_without_its_weights_is_refused(tmp_path: Path) -> None:
    xml = openvino_ir(tmp_path, "addsub_ov", onnx_models.add_sub())
    xml.with_suffix(".bin").unlink()
    with pytest.raises(ConfigError, match=r"model\.bin is missing") as info:
        Repository.load(tmp_path)
    assert str(xml) in str(info.value)


def test_an_openvino_config_that_disagrees_stops_loading(tmp_path: Path) -> None:
    openvino_ir(tmp_path, "addsub_ov", onnx_models.add_sub())
    write(
        tmp_path,
        "addsub_ov",
        "name: addsub_ov\nbackend: openvino\nmax_batch_size: 4\n"
        "input: [{name: INPUT0, data_type: TYPE_FP16, dims: [4]},"
        " {name: INPUT1, data_type: TYPE_FP32, dims: [4]}]\n"
        "output: [{name: OUTPUT0, data_type: TYPE_FP32, dims: [4]}]\n",
        "config.yaml",
    )
    with pytest.raises(ConfigError, match="'INPUT0': the config says TYPE_FP16, the model has"):
        Repository.load(tmp_path)
