"""Unit tests for config.yaml parsing (weir.config) and the model repository (weir.repository)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from weir.config import Backend, InstanceKind, LatestPolicy, ModelConfig, load_config
from weir.errors import ConfigError, NotFound
from weir.repository import Repository


def valid_raw(**overrides: Any) -> dict[str, Any]:
    """A minimal valid config as the dict a config.yaml would hold."""
    raw: dict[str, Any] = {
        "backend": "pytorch",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    raw.update(overrides)
    return raw


def write_config(model_dir: Path, raw: Any) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def load(tmp_path: Path, raw: Any, name: str = "m") -> ModelConfig:
    return load_config(write_config(tmp_path / name, raw), name)


def config_error(tmp_path: Path, raw: Any, name: str = "m") -> tuple[str, Path]:
    """Load a bad config; return the ConfigError message and the config's path."""
    path = write_config(tmp_path / name, raw)
    with pytest.raises(ConfigError) as info:
        load_config(path, name)
    return str(info.value), path


# --- valid configs -------------------------------------------------------------------------


def test_valid_config_loads_with_fields_and_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, valid_raw())

    assert config.name == "m"
    assert config.backend is Backend.PYTORCH
    assert config.max_batch_size == 8
    assert [spec.name for spec in config.input] == ["INPUT0"]
    assert config.input[0].dims == (4,)
    assert config.input[0].optional is False
    assert config.output[0].name == "OUTPUT0"
    assert config.dynamic_batching is None
    assert config.parameters == {}


def test_name_defaults_to_directory_name(tmp_path: Path) -> None:
    assert load(tmp_path, valid_raw(), name="resnet").name == "resnet"


def test_explicit_name_equal_to_directory_is_accepted(tmp_path: Path) -> None:
    assert load(tmp_path, valid_raw(name="resnet"), name="resnet").name == "resnet"


@pytest.mark.parametrize("alias", ["torch", "pytorch", "pytorch_libtorch"])
def test_backend_aliases_resolve_to_pytorch(tmp_path: Path, alias: str) -> None:
    assert load(tmp_path, valid_raw(backend=alias)).backend is Backend.PYTORCH


def test_platform_pytorch_libtorch_selects_pytorch_backend(tmp_path: Path) -> None:
    raw = valid_raw()
    del raw["backend"]
    raw["platform"] = "pytorch_libtorch"
    assert load(tmp_path, raw).backend is Backend.PYTORCH


@pytest.mark.parametrize(
    ("alias", "backend"),
    [("onnxruntime_onnx", Backend.ONNXRUNTIME), ("tensorrt_plan", Backend.TENSORRT)],
)
def test_triton_platform_names_resolve_to_backends(
    tmp_path: Path, alias: str, backend: Backend
) -> None:
    assert load(tmp_path, valid_raw(backend=alias)).backend is backend


def test_config_datatype_names_are_held_as_protocol_names(tmp_path: Path) -> None:
    raw = valid_raw(
        input=[
            {"name": "A", "data_type": "TYPE_FP32", "dims": [1]},
            {"name": "B", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "C", "data_type": "TYPE_BF16", "dims": [1]},
            {"name": "D", "data_type": "INT64", "dims": [1]},
        ]
    )
    config = load(tmp_path, raw)
    assert [spec.datatype for spec in config.input] == ["FP32", "BYTES", "BF16", "INT64"]


def test_default_version_policy_is_latest_one_version(tmp_path: Path) -> None:
    policy = load(tmp_path, valid_raw()).version_policy
    assert policy.latest == LatestPolicy(num_versions=1)
    assert policy.all is None
    assert policy.specific is None


def test_empty_version_policy_means_latest_one_version(tmp_path: Path) -> None:
    policy = load(tmp_path, valid_raw(version_policy={})).version_policy
    assert policy.latest == LatestPolicy(num_versions=1)


def test_default_instance_group_is_one_auto_instance(tmp_path: Path) -> None:
    config = load(tmp_path, valid_raw())
    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    assert group.kind is InstanceKind.AUTO
    assert group.count == 1
    assert config.instance_kinds() == {InstanceKind.AUTO}


def test_instance_group_kind_and_count_are_read(tmp_path: Path) -> None:
    raw = valid_raw(instance_group=[{"kind": "KIND_CPU", "count": 3}])
    group = load(tmp_path, raw).instance_group[0]
    assert (group.kind, group.count) == (InstanceKind.CPU, 3)


def test_triton_string_value_parameters_are_flattened(tmp_path: Path) -> None:
    raw = valid_raw(parameters={"threads": {"string_value": "4"}, "mode": "fast"})
    assert load(tmp_path, raw).parameters == {"threads": "4", "mode": "fast"}


def test_dynamic_batching_preferred_sizes_are_sorted_and_deduplicated(tmp_path: Path) -> None:
    raw = valid_raw(
        dynamic_batching={"preferred_batch_size": [8, 2, 4, 2], "max_queue_delay_microseconds": 100}
    )
    batching = load(tmp_path, raw).dynamic_batching
    assert batching is not None
    assert batching.preferred_batch_size == (2, 4, 8)
    assert batching.max_queue_delay_microseconds == 100


def test_full_shape_prepends_batch_dim_only_for_batching_models(tmp_path: Path) -> None:
    batching = load(tmp_path, valid_raw(max_batch_size=8), name="a")
    plain = load(tmp_path, valid_raw(max_batch_size=0), name="b")
    assert batching.full_shape(batching.input[0]) == [-1, 4]
    assert plain.full_shape(plain.input[0]) == [4]


def test_ignored_triton_field_is_dropped_not_rejected(tmp_path: Path) -> None:
    config = load(tmp_path, valid_raw(optimization={"cuda": {"graphs": True}}))
    assert config.backend is Backend.PYTORCH


# --- bad configs: ConfigError naming the file and the field --------------------------------


def test_unknown_data_type_names_file_and_field(tmp_path: Path) -> None:
    raw = valid_raw(input=[{"name": "INPUT0", "data_type": "TYPE_FLOAT", "dims": [4]}])
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "input.0.data_type" in message
    assert "TYPE_FLOAT" in message


def test_unknown_output_data_type_names_output_field(tmp_path: Path) -> None:
    raw = valid_raw(output=[{"name": "OUTPUT0", "data_type": "FLOAT", "dims": [4]}])
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "output.0.data_type" in message


def test_missing_backend_is_rejected(tmp_path: Path) -> None:
    raw = valid_raw()
    del raw["backend"]
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "backend" in message


def test_unknown_backend_is_rejected_naming_it(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, valid_raw(backend="tensorflow"))
    assert str(path) in message
    assert "backend" in message
    assert "tensorflow" in message


@pytest.mark.parametrize("dims", [[0], [4, 0], [-2]])
def test_dims_must_be_positive_or_minus_one(tmp_path: Path, dims: list[int]) -> None:
    raw = valid_raw(input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": dims}])
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "input.0.dims" in message


def test_duplicate_input_name_is_rejected(tmp_path: Path) -> None:
    spec = {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}
    message, path = config_error(tmp_path, valid_raw(input=[spec, spec]))
    assert str(path) in message
    assert "input" in message
    assert "'INPUT0' appears twice" in message


def test_duplicate_output_name_is_rejected(tmp_path: Path) -> None:
    spec = {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}
    message, path = config_error(tmp_path, valid_raw(output=[spec, spec]))
    assert str(path) in message
    assert "output name 'OUTPUT0' appears twice" in message


def test_preferred_batch_size_over_max_batch_size_is_rejected(tmp_path: Path) -> None:
    raw = valid_raw(max_batch_size=4, dynamic_batching={"preferred_batch_size": [2, 8]})
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "preferred_batch_size" in message
    assert "max_batch_size" in message


def test_non_positive_preferred_batch_size_is_rejected(tmp_path: Path) -> None:
    raw = valid_raw(dynamic_batching={"preferred_batch_size": [0]})
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "dynamic_batching.preferred_batch_size" in message


def test_negative_max_batch_size_is_rejected(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, valid_raw(max_batch_size=-1))
    assert str(path) in message
    assert "max_batch_size" in message


def test_name_not_matching_directory_is_rejected(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, valid_raw(name="other"), name="m")
    assert str(path) in message
    assert "name" in message
    assert "'other'" in message
    assert "'m'" in message


def test_misspelled_field_is_rejected_naming_it(tmp_path: Path) -> None:
    raw = valid_raw()
    raw["max_batch_sise"] = raw.pop("max_batch_size")
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "max_batch_sise" in message


def test_misspelled_nested_field_is_rejected_naming_its_path(tmp_path: Path) -> None:
    raw = valid_raw(input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4], "dim": 1}])
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "input.0.dim" in message


def test_missing_inputs_are_rejected(tmp_path: Path) -> None:
    raw = valid_raw()
    del raw["input"]
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "input" in message


def test_two_version_policies_at_once_are_rejected(tmp_path: Path) -> None:
    raw = valid_raw(version_policy={"latest": {"num_versions": 1}, "all": {}})
    message, path = config_error(tmp_path, raw)
    assert str(path) in message
    assert "version_policy" in message


def test_invalid_yaml_is_rejected_naming_the_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    path = model_dir / "config.yaml"
    path.write_text("backend: pytorch\ninput: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, "m")
    assert str(path) in str(info.value)
    assert "cannot read config" in str(info.value)


def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, ["backend", "pytorch"])
    assert str(path) in message
    assert "mapping" in message


def test_parameters_that_are_not_a_mapping_raise_config_error(tmp_path: Path) -> None:
    message, path = config_error(tmp_path, valid_raw(parameters=["threads", "4"]))
    assert str(path) in message
    assert "parameters" in message


# --- Repository.load and resolve -----------------------------------------------------------


def make_model(root: Path, name: str, versions: list[int], **overrides: Any) -> Path:
    model_dir = root / name
    write_config(model_dir, valid_raw(**overrides))
    for version in versions:
        (model_dir / str(version)).mkdir()
    return model_dir


def test_latest_two_versions_of_three_serves_the_newest_two(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1, 2, 3], version_policy={"latest": {"num_versions": 2}})
    assert Repository.load(tmp_path).models["m"].versions == ("2", "3")


def test_default_policy_serves_only_the_newest_version_numerically(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [2, 10, 9])
    entry = Repository.load(tmp_path).models["m"]
    assert entry.versions == ("10",)
    assert entry.latest == "10"


def test_all_policy_serves_every_version_ascending(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [3, 1, 2], version_policy={"all": {}})
    assert Repository.load(tmp_path).models["m"].versions == ("1", "2", "3")


def test_specific_policy_serves_only_the_listed_versions_present(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1, 2, 3], version_policy={"specific": {"versions": [3, 1, 7]}})
    assert Repository.load(tmp_path).models["m"].versions == ("1", "3")


def test_non_numeric_directories_are_not_versions(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", [1], version_policy={"all": {}})
    (model_dir / "scratch").mkdir()
    assert Repository.load(tmp_path).models["m"].versions == ("1",)


def test_model_without_version_directories_is_a_config_error(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "m", [])
    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    assert str(model_dir / "config.yaml") in str(info.value)
    assert "version_policy" in str(info.value)


def test_specific_policy_matching_no_directory_is_a_config_error(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1], version_policy={"specific": {"versions": [5]}})
    with pytest.raises(ConfigError, match="no version directory to serve"):
        Repository.load(tmp_path)


def test_config_pbtxt_only_model_is_a_config_error_naming_pbtxt(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text('name: "m"\nbackend: "pytorch"\n')
    with pytest.raises(ConfigError) as info:
        Repository.load(tmp_path)
    assert "config.pbtxt" in str(info.value)


def test_model_dir_without_any_config_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"no config\.yaml"):
        Repository.load(tmp_path)


def test_repository_root_that_is_not_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        Repository.load(tmp_path / "missing")


def test_repository_skips_hidden_directories_and_files(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1])
    (tmp_path / ".cache").mkdir()
    (tmp_path / "README.md").write_text("models")
    assert sorted(Repository.load(tmp_path).models) == ["m"]


def test_repository_loads_every_model_by_name(tmp_path: Path) -> None:
    make_model(tmp_path, "a", [1])
    make_model(tmp_path, "b", [1, 2])
    repository = Repository.load(tmp_path)
    assert sorted(entry.name for entry in repository) == ["a", "b"]
    assert repository.models["b"].version_path("2") == (tmp_path / "b" / "2").resolve()


def test_resolve_without_version_gives_the_latest_served(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1, 2, 3], version_policy={"all": {}})
    repository = Repository.load(tmp_path)
    entry, version = repository.resolve("m", None)
    assert entry.name == "m"
    assert version == "3"
    assert repository.resolve("m", "")[1] == "3"


def test_resolve_named_version_gives_that_version(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1, 2], version_policy={"all": {}})
    assert Repository.load(tmp_path).resolve("m", "1")[1] == "1"


def test_resolve_unknown_model_raises_not_found(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1])
    with pytest.raises(NotFound, match="Request for unknown model: 'nope' is not found"):
        Repository.load(tmp_path).resolve("nope")


def test_resolve_version_not_served_raises_not_found(tmp_path: Path) -> None:
    # Version 1 is on disk but the default policy serves only version 2.
    make_model(tmp_path, "m", [1, 2])
    repository = Repository.load(tmp_path)
    with pytest.raises(NotFound, match="'m' version 1 is not found"):
        repository.resolve("m", "1")
    with pytest.raises(NotFound, match="version 9 is not found"):
        repository.resolve("m", "9")


def test_a_version_directory_linking_outside_the_repository_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    root = tmp_path / "repo"
    (root / "m").mkdir(parents=True)
    (root / "m" / "config.yaml").write_text(
        "backend: pytorch\ninput: [{name: X, data_type: TYPE_FP32, dims: [1]}]\n"
        "output: [{name: Y, data_type: TYPE_FP32, dims: [1]}]\n"
    )
    (root / "m" / "1").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match="leads outside the model repository"):
        Repository.load(root)


def test_an_unknown_name_is_echoed_cut_short(tmp_path: Path) -> None:
    make_model(tmp_path, "m", [1])
    repository = Repository.load(tmp_path)
    with pytest.raises(NotFound) as info:
        repository.resolve("x" * 100_000)
    assert len(info.value.message) < 200
    assert info.value.message.startswith("Request for unknown model: 'xxx")
    with pytest.raises(NotFound) as info:
        repository.resolve("m", "9" * 100_000)
    assert len(info.value.message) < 200


def test_max_input_bytes_is_read_and_must_be_a_positive_byte_count(tmp_path: Path) -> None:
    assert load(tmp_path, valid_raw(parameters={"max_input_bytes": "4096"})).max_input_bytes == 4096
    assert load(tmp_path, valid_raw(), name="plain").max_input_bytes is None
    message, _ = config_error(tmp_path, valid_raw(parameters={"max_input_bytes": "-1"}), "bad")
    assert "max_input_bytes must be a whole number of bytes > 0" in message


def test_response_timeout_is_read_and_must_be_a_positive_number_of_seconds(
    tmp_path: Path,
) -> None:
    timed = load(tmp_path, valid_raw(parameters={"response_timeout_s": {"string_value": "2.5"}}))
    assert timed.response_timeout_s == 2.5
    assert load(tmp_path, valid_raw(), name="plain").response_timeout_s is None
    for at, bad in enumerate(("0", "-1", "soon", "inf", "nan")):
        raw = valid_raw(parameters={"response_timeout_s": bad})
        message, _ = config_error(tmp_path, raw, f"bad{at}")
        assert "response_timeout_s must be a number of seconds > 0" in message
