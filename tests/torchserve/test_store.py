"""A TorchServe model store turned into a Triton-layout repository Weir's loader reads."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.torchserve.archives import build_archive, write_zip
from weir.config import Backend, InstanceKind
from weir.config_parameters import LOAD_TIMEOUT_S
from weir.repository import Repository, load_model
from weir.torchserve.properties import ModelVersionSettings
from weir.torchserve.store import (
    ModelStore,
    Registration,
    StoreConflict,
    StoreError,
    StoreForbidden,
    StoreNotFound,
)

CONFIGURED_YAML = "minWorkers: 2\nmaxWorkers: 3\nbatchSize: 4\nmaxBatchDelay: 50\ndeviceType: cpu\n"


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def load_timeout(store: ModelStore, name: str) -> str:  # TorchServe's startupTimeout
    return load_model(store.repository, name).config.parameters[LOAD_TIMEOUT_S]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of real archives: three versions of noop, and one of each other kind."""
    store = tmp_path_factory.mktemp("store")
    build_archive(store, "noop")
    for version in ("2.0", "3.0"):
        built = build_archive(store / f"v{version}", "noop", version=version)
        built.rename(store / f"noop_v{version[0]}.mar")
        shutil.rmtree(store / f"v{version}")
    build_archive(store, "configured", config_yaml=CONFIGURED_YAML + "startupTimeout: 50\n")
    build_archive(store, "packed", archive_format="tgz")
    build_archive(store, "unpacked", archive_format="no-archive")
    manifest = {"runtime": "python", "model": {"handler": "h.py", "modelVersion": "1.0"}}
    write_zip(store / "my-model.mar", {"MAR-INF/MANIFEST.json": json.dumps(manifest)})
    (store / "junk.mar").write_text("not an archive")
    return store


@pytest.fixture
def store(archives: Path, tmp_path: Path) -> ModelStore:
    return ModelStore(archives, tmp_path / "repo")


def test_archives_lists_archive_files_and_directories_only(tmp_path: Path) -> None:
    build_archive(tmp_path, "a")
    build_archive(tmp_path, "b", archive_format="tgz")
    build_archive(tmp_path, "c", archive_format="no-archive")
    build_archive(tmp_path / ".hidden", "d")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    repository = tmp_path / "generated"
    store = ModelStore(tmp_path, repository)
    store.register("a.mar")
    assert (repository / "a" / "1" / "model.mar").is_symlink()
    assert store.archives() == ["a.mar", "b.tar.gz", "c"]


def test_registering_writes_a_repository_entry_weir_loads(store: ModelStore) -> None:
    registration = store.register("noop.mar")
    assert registration == Registration("noop", "1", "1.0", "noop.mar", 1, 1, 100)
    link = store.repository / "noop" / "1" / "model.mar"
    assert link.is_symlink() and link.resolve() == (store.store_dir / "noop.mar").resolve()
    assert (store.repository / ".torchserve" / "noop.json").is_file()
    entry = load_model(store.repository, "noop")
    assert entry.config.backend is Backend.TORCHSERVE
    assert entry.config.max_batch_size == 1
    assert entry.config.dynamic_batching is not None
    assert entry.config.dynamic_batching.preferred_batch_size == (1,)
    assert entry.config.dynamic_batching.max_queue_delay_microseconds == 100_000
    assert [(g.count, g.kind) for g in entry.config.instance_group] == [(1, InstanceKind.AUTO)]
    assert entry.versions == ("1",)
    assert [s.name for s in entry.config.input] == ["body", "ts_request"]
    assert list(Repository.load(store.repository).models) == ["noop"]


def test_settings_come_from_the_archives_model_config(store: ModelStore) -> None:
    registration = store.register(
        "configured.mar", defaults=ModelVersionSettings(startup_timeout_s=30)
    )
    assert (registration.batch_size, registration.max_batch_delay_ms) == (4, 50)
    assert registration.workers == 2
    entry = load_model(store.repository, "configured")
    assert entry.config.max_batch_size == 4
    assert entry.config.dynamic_batching is not None
    assert entry.config.dynamic_batching.max_queue_delay_microseconds == 50_000
    assert [(g.count, g.kind) for g in entry.config.instance_group] == [(2, InstanceKind.CPU)]
    version = store.describe("configured").versions[0]
    assert (version.min_workers, version.max_workers) == (2, 3)
    assert version.startup_timeout_s == 50 and load_timeout(store, "configured") == "50"


def test_request_settings_win_over_the_archive_and_properties(store: ModelStore) -> None:
    properties = ModelVersionSettings(batch_size=16, max_batch_delay_ms=7, response_timeout_s=30)
    ask: dict[str, Any] = dict(batch_size=2, workers=5, response_timeout_s=9, startup_timeout_s=11)
    registration = store.register("configured.mar", **ask, defaults=properties)
    assert (registration.batch_size, registration.max_batch_delay_ms) == (2, 50)
    assert registration.workers == 5
    version = store.describe("configured").versions[0]
    assert (version.response_timeout_s, version.startup_timeout_s) == (9, 11)
    assert load_model(store.repository, "configured").config.response_timeout_s == 9
    assert load_timeout(store, "configured") == "11"


def test_the_timeouts_fall_back_to_their_default_keys_then_120(store: ModelStore) -> None:
    # The worker enforces them (workers.lane, workers.loading): the config carries them.
    store.register("noop.mar")
    assert load_model(store.repository, "noop").config.response_timeout_s == 120
    assert load_timeout(store, "noop") == "120"
    store.register("packed.tar.gz", default_response_timeout_s=300, default_startup_timeout_s=400)
    version = store.describe("packed").versions[0]
    assert (version.response_timeout_s, version.startup_timeout_s) == (300, 400)
    assert load_model(store.repository, "packed").config.response_timeout_s == 300
    assert load_timeout(store, "packed") == "400"
    properties = ModelVersionSettings(response_timeout_s=30, startup_timeout_s=40)
    defaults: dict[str, Any] = {"default_response_timeout_s": 300, "default_startup_timeout_s": 400}
    store.register("unpacked", **defaults, defaults=properties)
    assert load_model(store.repository, "unpacked").config.response_timeout_s == 30
    assert load_timeout(store, "unpacked") == "40"


def test_properties_settings_apply_below_the_archive(store: ModelStore) -> None:
    properties = ModelVersionSettings(
        batch_size=16, max_batch_delay_ms=7, min_workers=3, max_workers=4, response_timeout_s=30
    )
    plain = store.register("noop.mar", defaults=properties)
    assert (plain.batch_size, plain.max_batch_delay_ms, plain.workers) == (16, 7, 3)
    assert store.describe("noop").versions[0].response_timeout_s == 30
    configured = store.register("configured.mar", defaults=properties)
    assert (configured.batch_size, configured.max_batch_delay_ms) == (4, 50)


def test_default_workers_apply_when_nothing_else_says(store: ModelStore) -> None:
    assert store.register("noop.mar", default_workers=4).workers == 4


def test_bad_request_settings_are_refused(store: ModelStore) -> None:
    with pytest.raises(StoreError, match="batch_size must be 1 or more, not 0"):
        store.register("noop.mar", batch_size=0)
    with pytest.raises(StoreError, match="startup_timeout must be 1 or more, not 0"):
        store.register("noop.mar", startup_timeout_s=0)
    assert store.models() == []


def test_a_second_version_keeps_the_models_settings_and_the_first_stays_default(
    store: ModelStore,
) -> None:
    store.register("noop.mar", batch_size=2)
    second = store.register("noop_v2.mar", batch_size=8, workers=3)
    assert (second.weir_version, second.ts_version, second.batch_size) == ("2", "2.0", 2)
    assert second.workers == 1
    entry = load_model(store.repository, "noop")
    assert entry.versions == ("1", "2") and entry.config.max_batch_size == 2
    assert store.version_for("noop", None) == "1"
    assert store.version_for("noop", "2.0") == "2"
    assert store.ts_version_of("noop", "2") == "2.0"
    record = store.describe("noop")
    assert [(v.ts_version, v.is_default) for v in record.versions] == [
        ("1.0", True),
        ("2.0", False),
    ]
    assert record.default_url == "noop.mar"


def test_registering_a_version_twice_is_a_conflict(store: ModelStore) -> None:
    store.register("noop.mar")
    with pytest.raises(StoreConflict) as caught:
        store.register("noop.mar")
    assert str(caught.value) == "Model version 1.0 is already registered for model noop"
    assert caught.value.http_status == 409


@pytest.mark.parametrize(
    "url",
    ["http://example.com/noop.mar", "https://x/noop.mar", "s3://bucket/noop.mar", "file:///a.mar"],
)
def test_urls_are_refused_with_the_way_to_register(store: ModelStore, url: str) -> None:
    with pytest.raises(StoreError, match="put the archive in the model store") as caught:
        store.register(url)
    assert caught.value.http_status == 400


def test_a_path_outside_the_store_is_refused(store: ModelStore, tmp_path: Path) -> None:
    outside = build_archive(tmp_path / "elsewhere", "noop")
    with pytest.raises(StoreError, match="is outside the model store") as caught:
        store.register(str(outside))
    assert caught.value.http_status == 400
    with pytest.raises(
        StoreNotFound, match=exactly("Relative path is not allowed in url: ../x.mar")
    ):
        store.register("../x.mar")


def test_an_absolute_path_inside_the_store_is_accepted(store: ModelStore) -> None:
    registration = store.register(str(store.store_dir / "noop.mar"))
    assert registration.url == "noop.mar"


def test_a_missing_archive_is_not_found(store: ModelStore) -> None:
    with pytest.raises(StoreNotFound, match=exactly("Model not found at: missing.mar")) as caught:
        store.register("missing.mar")
    assert caught.value.http_status == 404


def test_a_bad_archive_is_refused_before_anything_is_written(store: ModelStore) -> None:
    with pytest.raises(StoreError, match=r"junk\.mar: not a TorchServe model archive"):
        store.register("junk.mar")
    assert not store.repository.exists() or store.models() == []


def test_the_model_name_can_be_given_or_comes_from_the_file_name(store: ModelStore) -> None:
    assert store.register("noop.mar", model_name="renamed").name == "renamed"
    assert store.register("my-model.mar").name == "my_model"
    with pytest.raises(StoreError, match=re.escape("Invalid model name '../evil'")):
        store.register("noop.mar", model_name="../evil")
    assert store.models() == ["my_model", "renamed"]


@pytest.mark.parametrize(("url", "name"), [("packed.tar.gz", "packed"), ("unpacked", "unpacked")])
def test_tgz_and_directory_archives_register(store: ModelStore, url: str, name: str) -> None:
    assert store.register(url).name == name
    assert load_model(store.repository, name).versions == ("1",)


def test_scale_rewrites_the_instance_count(store: ModelStore) -> None:
    store.register("noop.mar")
    store.register("noop_v2.mar")
    store.scale("noop", 3)
    entry = load_model(store.repository, "noop")
    assert [g.count for g in entry.config.instance_group] == [3]
    assert {(v.min_workers, v.max_workers) for v in store.describe("noop").versions} == {(3, 3)}
    with pytest.raises(StoreError, match="workers must be 1 or more, not 0"):
        store.scale("noop", 0)
    with pytest.raises(StoreNotFound, match=exactly("Model not found: nope")):
        store.scale("nope", 2)


def test_set_default_moves_the_default_version(store: ModelStore) -> None:
    store.register("noop.mar")
    store.register("noop_v2.mar")
    assert store.set_default("noop", "2.0") == "2"
    assert store.version_for("noop", None) == "2"
    assert store.describe("noop").default.ts_version == "2.0"
    with pytest.raises(
        StoreNotFound, match=exactly("Model version 3.0 does not exist for model noop")
    ):
        store.set_default("noop", "3.0")
    with pytest.raises(StoreNotFound, match=exactly("Model not found: nope")) as caught:
        store.set_default("nope", "1.0")
    assert caught.value.http_status == 404


def test_unregister_refuses_the_default_while_others_remain(store: ModelStore) -> None:
    store.register("noop.mar")
    store.register("noop_v2.mar")
    with pytest.raises(
        StoreForbidden, match=exactly("Cannot remove default version for model noop")
    ) as e:
        store.unregister("noop")
    assert e.value.http_status == 403
    with pytest.raises(StoreForbidden):
        store.unregister("noop", "1.0")
    assert load_model(store.repository, "noop").versions == ("1", "2")


def test_unregister_removes_versions_then_the_model(store: ModelStore) -> None:
    store.register("noop.mar")
    store.register("noop_v2.mar")
    assert store.unregister("noop", "2.0") == ["2"]
    assert not (store.repository / "noop" / "2").exists()
    assert load_model(store.repository, "noop").versions == ("1",)
    assert store.unregister("noop") == ["1"]
    assert store.models() == []
    assert not (store.repository / "noop").exists()
    assert not (store.repository / ".torchserve" / "noop.json").exists()
    assert [p.name for p in store.repository.iterdir()] == [".torchserve"]


def test_unregister_of_unknown_models_and_versions_uses_torchserves_words(
    store: ModelStore,
) -> None:
    with pytest.raises(StoreNotFound, match=exactly("Model not found: noop")):
        store.unregister("noop")
    store.register("noop.mar")
    with pytest.raises(
        StoreNotFound, match=exactly("Model version: 9.0 does not exist for model: noop")
    ):
        store.unregister("noop", "9.0")
    with pytest.raises(
        StoreNotFound, match=exactly("Model version: 9.0 does not exist for model: noop")
    ):
        store.version_for("noop", "9.0")


def test_reset_forgets_every_registered_model_and_nothing_else(store: ModelStore) -> None:
    store.register("noop.mar")
    store.register("noop_v2.mar")
    store.register("configured.mar")
    mine = store.repository / "mine"
    (mine / "1").mkdir(parents=True)
    (mine / "config.yaml").write_text("name: mine\nbackend: onnxruntime\n")
    (mine / "1" / "model.onnx").write_bytes(b"weights")
    assert store.reset() == ["configured", "noop"]
    assert store.models() == []
    assert sorted(p.name for p in store.repository.iterdir()) == [".torchserve", "mine"]
    assert list((store.repository / ".torchserve").glob("*.json")) == []
    assert (mine / "config.yaml").read_text() == "name: mine\nbackend: onnxruntime\n"
    assert (mine / "1" / "model.onnx").read_bytes() == b"weights"
    assert (store.store_dir / "noop.mar").is_file()


def test_after_reset_a_model_registers_afresh(store: ModelStore) -> None:
    store.register("noop.mar", batch_size=2)
    store.register("noop_v2.mar")
    store.reset()
    registration = store.register("noop_v2.mar", batch_size=8)
    assert (registration.weir_version, registration.batch_size) == ("1", 8)
    assert load_model(store.repository, "noop").versions == ("1",)
    assert store.reset() == ["noop"]
    assert store.reset() == []


def test_reset_of_an_unused_repository_creates_nothing(store: ModelStore) -> None:
    assert store.reset() == []
    assert not store.repository.exists()


def test_reset_finishes_a_model_whose_directory_is_already_gone(store: ModelStore) -> None:
    store.register("noop.mar")
    shutil.rmtree(store.repository / "noop")
    assert store.reset() == ["noop"]
    assert store.models() == []


def test_reset_keeps_a_hand_made_model_the_store_refused_to_overwrite(
    store: ModelStore,
) -> None:
    (store.repository / "noop").mkdir(parents=True)
    with pytest.raises(StoreConflict, match="was not made by the model store"):
        store.register("noop.mar")
    assert store.reset() == []
    assert (store.repository / "noop").is_dir()


def test_weir_versions_are_not_reused_while_the_model_is_registered(store: ModelStore) -> None:
    store.register("noop.mar")
    store.register("noop_v2.mar")
    store.unregister("noop", "2.0")
    assert store.register("noop_v2.mar").weir_version == "3"
    assert load_model(store.repository, "noop").versions == ("1", "3")


def test_describe_records_startup_and_runtime(store: ModelStore) -> None:
    store.register("noop.mar", startup=True, response_timeout_s=60, startup_timeout_s=90)
    version = store.describe("noop").versions[0]
    assert version.loaded_at_startup and version.runtime == "python"
    assert version.response_timeout_s == 60 and version.url == "noop.mar"
    assert version.startup_timeout_s == 90
    with pytest.raises(StoreNotFound, match=exactly("Model not found: nope")):
        store.describe("nope")


def test_concurrent_registrations_of_one_version_make_one_version(store: ModelStore) -> None:
    results: list[object] = []
    barrier = threading.Barrier(6)

    def register(url: str) -> None:
        barrier.wait()
        try:
            results.append(store.register(url))
        except StoreConflict as exc:
            results.append(exc)

    urls = ["noop.mar"] * 4 + ["noop_v2.mar", "noop_v3.mar"]
    threads = [threading.Thread(target=register, args=(url,)) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    registered = [r for r in results if isinstance(r, Registration)]
    assert sorted(r.ts_version for r in registered) == ["1.0", "2.0", "3.0"]
    assert sum(isinstance(r, StoreConflict) for r in results) == 3
    assert load_model(store.repository, "noop").versions == ("1", "2", "3")
