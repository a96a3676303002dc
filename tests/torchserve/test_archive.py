"""Reading TorchServe archives of every format the archiver writes, and refusing bad ones."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from tests.torchserve.archives import NOOP_HANDLER, build_archive, write_zip
from weir.torchserve.archive import (
    ArchiveError,
    ArchiveFormat,
    default_cache_dir,
    detect_format,
    extract,
    read_manifest,
    read_model_config,
)

FORMATS = ["default", "zip-store", "tgz", "no-archive"]
CONFIG_YAML = "minWorkers: 2\nbatchSize: 4\nhandler:\n  threshold: 0.5\n"
EXTRAS: dict[str, str | bytes] = {"vocab.txt": "a\nb\n", "assets/labels.json": '["x"]'}
MANIFEST = {"runtime": "python", "model": {"modelName": "m", "handler": "h.py"}}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One archive per format, all with the same handler, extra files and config."""
    store = tmp_path_factory.mktemp("store")
    return {
        fmt: build_archive(
            store / fmt,
            "echo",
            version="2.5",
            extra_files=EXTRAS,
            config_yaml=CONFIG_YAML,
            archive_format=fmt,
        )
        for fmt in FORMATS
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_manifest_is_read_from_every_archive_format(built: dict[str, Path], fmt: str) -> None:
    manifest = read_manifest(built[fmt])
    assert manifest.model_name == "echo"
    assert manifest.model_version == "2.5"
    assert manifest.handler == "handler.py"
    assert manifest.config_file == "model-config.yaml"
    assert manifest.runtime == "python"
    assert manifest.archiver_version == "0.12.0"
    assert manifest.serialized_file is None
    assert manifest.raw["model"]["modelName"] == "echo"


def test_format_is_told_by_content_through_a_symlink_named_model_mar(
    built: dict[str, Path], tmp_path: Path
) -> None:
    link = tmp_path / "model.mar"
    link.symlink_to(built["tgz"])
    assert detect_format(link) is ArchiveFormat.TGZ
    assert read_manifest(link).model_name == "echo"


@pytest.mark.parametrize("fmt", FORMATS)
def test_model_config_yaml_is_read_from_the_archive(built: dict[str, Path], fmt: str) -> None:
    config = read_model_config(built[fmt])
    assert config == {"minWorkers": 2, "batchSize": 4, "handler": {"threshold": 0.5}}


def test_an_archive_without_model_config_has_an_empty_one(tmp_path: Path) -> None:
    assert read_model_config(build_archive(tmp_path, "plain")) == {}


def test_a_manifest_without_model_version_is_version_1_0(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "m.mar", {"MAR-INF/MANIFEST.json": json.dumps(MANIFEST)})
    manifest = read_manifest(archive)
    assert manifest.model_version == "1.0"
    assert manifest.archiver_version is None


def test_an_archive_from_before_the_archiver_version_field_is_read(tmp_path: Path) -> None:
    # The shape of archives written before torch-model-archiver 0.2 (TorchServe's test data).
    old = {
        "runtime": "python",
        "model": {"modelName": "noop", "serializedFile": "model.pt", "handler": "service.py"},
        "modelServerVersion": "1.0",
        "implementationVersion": "1.0",
        "specificationVersion": "1.0",
    }
    archive = write_zip(tmp_path / "noop.mar", {"MAR-INF/MANIFEST.json": json.dumps(old)})
    manifest = read_manifest(archive)
    assert (manifest.model_name, manifest.handler) == ("noop", "service.py")
    assert manifest.serialized_file == "model.pt"


@pytest.mark.parametrize("fmt", ["default", "zip-store", "tgz"])
def test_extraction_yields_the_archived_files_at_the_root(
    built: dict[str, Path], fmt: str, tmp_path: Path
) -> None:
    root = extract(built[fmt], tmp_path / "cache")
    assert (root / "handler.py").read_text() == NOOP_HANDLER
    assert (root / "vocab.txt").read_text() == "a\nb\n"
    assert (root / "assets" / "labels.json").read_text() == '["x"]'
    assert (root / "model-config.yaml").read_text() == CONFIG_YAML
    assert json.loads((root / "MAR-INF" / "MANIFEST.json").read_text())["model"]


def test_a_directory_archive_is_used_in_place(built: dict[str, Path], tmp_path: Path) -> None:
    assert extract(built["no-archive"], tmp_path / "cache") == built["no-archive"]
    assert not (tmp_path / "cache").exists()


def test_a_directory_holding_one_archive_directory_is_that_archive(
    built: dict[str, Path], tmp_path: Path
) -> None:
    # A tgz unpacked with its root directory, as TorchServe accepts it.
    outer = built["no-archive"].parent
    assert extract(outer, tmp_path / "cache") == built["no-archive"]
    assert read_manifest(outer).model_name == "echo"


def test_extraction_is_reused_and_named_by_content(built: dict[str, Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = extract(built["default"], cache)
    stamp = (first / "handler.py").stat().st_mtime_ns
    copy = tmp_path / "copy.mar"
    copy.write_bytes(built["default"].read_bytes())
    assert extract(copy, cache) == first
    assert (first / "handler.py").stat().st_mtime_ns == stamp
    assert len(first.name) == 32


def test_concurrent_extractions_agree_and_leave_no_staging(
    built: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    results: list[Path] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        results.append(extract(built["tgz"], cache))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and len(set(results)) == 1
    assert [p.name for p in cache.iterdir()] == [results[0].name]
    assert (results[0] / "handler.py").read_text() == NOOP_HANDLER


def test_default_cache_dir_is_under_the_temp_dir() -> None:
    assert default_cache_dir().name == "weir-torchserve"


def test_a_corrupt_zip_is_refused_naming_the_file(built: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.mar"
    broken.write_bytes(built["default"].read_bytes()[:60])
    with pytest.raises(ArchiveError, match=r"broken\.mar: corrupt model archive"):
        read_manifest(broken)


def test_a_truncated_tgz_is_refused_naming_the_file(built: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(built["tgz"].read_bytes()[:40])
    with pytest.raises(ArchiveError, match=r"broken\.tar\.gz: corrupt model archive"):
        extract(broken, tmp_path / "cache")


def test_a_file_that_is_no_archive_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "model.mar"
    text.write_text("hello")
    with pytest.raises(ArchiveError, match=r"model\.mar: not a TorchServe model archive"):
        read_manifest(text)


def test_an_archive_without_manifest_is_refused(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "bare.mar", {"handler.py": NOOP_HANDLER})
    with pytest.raises(ArchiveError, match=r"bare\.mar: no MAR-INF/MANIFEST\.json"):
        read_manifest(archive)
    with pytest.raises(ArchiveError, match=r"bare\.mar: no MAR-INF/MANIFEST\.json"):
        extract(archive, tmp_path / "cache")


def test_a_manifest_that_is_not_json_is_refused(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "bad.mar", {"MAR-INF/MANIFEST.json": "{nope"})
    with pytest.raises(ArchiveError, match=r"bad\.mar: MAR-INF/MANIFEST\.json is not JSON"):
        read_manifest(archive)


def test_a_manifest_without_handler_is_refused(tmp_path: Path) -> None:
    manifest = {"runtime": "python", "model": {"modelName": "m", "modelVersion": "1.0"}}
    archive = write_zip(tmp_path / "nohandler.mar", {"MAR-INF/MANIFEST.json": json.dumps(manifest)})
    with pytest.raises(ArchiveError, match=r"nohandler\.mar: .* names no handler"):
        read_manifest(archive)


def test_a_manifest_without_model_entry_is_refused(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "nomodel.mar", {"MAR-INF/MANIFEST.json": "{}"})
    with pytest.raises(ArchiveError, match=r"nomodel\.mar: .* has no 'model' entry"):
        read_manifest(archive)


@pytest.mark.parametrize("member", ["../evil.py", "/etc/evil.py", "a/../../evil.py"])
def test_zip_slip_members_are_refused(tmp_path: Path, member: str) -> None:
    members = {"MAR-INF/MANIFEST.json": json.dumps(MANIFEST), member: "boom"}
    archive = write_zip(tmp_path / "slip.mar", members)
    with pytest.raises(ArchiveError, match=r"slip\.mar: unsafe member path"):
        read_manifest(archive)
    with pytest.raises(ArchiveError, match=r"slip\.mar: unsafe member path"):
        extract(archive, tmp_path / "cache")
    assert not (tmp_path / "evil.py").exists()


def test_a_link_inside_a_tgz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "link.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        data = json.dumps(MANIFEST).encode()
        info = tarfile.TarInfo("m/MAR-INF/MANIFEST.json")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("m/passwd")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    with pytest.raises(ArchiveError, match=r"link\.tar\.gz: member 'm/passwd' is a link"):
        extract(path, tmp_path / "cache")


def test_a_handler_given_as_module_and_function_is_archived(tmp_path: Path) -> None:
    archive = build_archive(tmp_path, "named", handler_file="entry:predict")
    assert read_manifest(archive).handler == "entry:predict"
    assert (extract(archive, tmp_path / "cache") / "entry.py").read_text() == NOOP_HANDLER
