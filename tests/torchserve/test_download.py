"""Archives registered by URL: fetched from a real HTTP server on 127.0.0.1 into the store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.torchserve.archives import build_archive
from tests.torchserve.http_files import serving
from weir.torchserve.download import Downloads, StoreExists
from weir.torchserve.gateway_settings import DEFAULT_ALLOWED_URLS
from weir.torchserve.store import ModelStore, StoreError, StoreNotFound

MIB = 1 << 20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    served = tmp_path_factory.mktemp("served")
    build_archive(served, "echo")
    build_archive(served, "other")
    (served / "notes.mar").write_text("not an archive")
    with serving(served) as url:
        yield url


def store_at(
    tmp_path: Path, allowed: str = DEFAULT_ALLOWED_URLS, max_bytes: int = 64 * MIB
) -> ModelStore:
    (tmp_path / "store").mkdir(parents=True)
    downloads = Downloads.of(allowed, max_bytes, 10.0)
    return ModelStore(tmp_path / "store", tmp_path / "store" / ".weir", downloads)


def leftovers(store: ModelStore) -> list[str]:
    """What the store holds besides its generated repository: nothing half-written."""
    return sorted(p.name for p in store.store_dir.iterdir() if p.name != ".weir")


def test_an_archive_is_fetched_registered_and_removed_with_its_last_version(
    tmp_path: Path, server: str
) -> None:
    store = store_at(tmp_path)
    url = f"{server}/echo.mar"
    registration = store.register(url)
    assert (registration.name, registration.url) == ("echo", url)  # listed by its URL
    assert (store.store_dir / "echo.mar").is_file()
    assert store.describe("echo").default_url == url
    assert store.archives() == ["echo.mar"]
    # The same URL again: TorchServe's answer, and the archive registered stays.
    with pytest.raises(StoreExists, match=r"^Model file already exists echo\.mar$"):
        store.register(url, model_name="again")
    assert (store.store_dir / "echo.mar").is_file()
    store.unregister("echo")
    assert store.archives() == []  # gone with its registration, as in TorchServe
    store.register(url)  # so it can be registered again
    assert store.reset() == ["echo"]
    assert store.archives() == []  # a new weir up forgets it too


def test_an_archive_of_the_store_under_the_same_name_is_kept(tmp_path: Path, server: str) -> None:
    store = store_at(tmp_path)
    store.register(f"{server}/echo.mar")
    store.register("echo.mar", model_name="local")  # the fetched file, by its name
    store.unregister("echo")
    assert store.archives() == ["echo.mar"]  # still registered as "local"


def test_urls_are_refused_clearly(tmp_path: Path, server: str) -> None:
    store = store_at(tmp_path, allowed=r"http://127\.0\.0\.1:\d+/(echo|away/.*|notes)\.mar")
    with pytest.raises(StoreNotFound, match=re.escape(f"Given URL {server}/other.mar does not")):
        store.register(f"{server}/other.mar")
    with pytest.raises(
        StoreError, match=re.escape("redirected to http://localhost:1/echo.mar, which")
    ):
        store.register(f"{server}/away/echo.mar")
    # Not an archive: refused as one in the store is, and the fetched file removed.
    with pytest.raises(StoreError, match=r"notes\.mar"):
        store.register(f"{server}/notes.mar")
    assert leftovers(store) == []

    anything = store_at(tmp_path / "any")
    with pytest.raises(
        StoreError,
        match=re.escape(f"Failed to download archive from: {server}/absent.mar: HTTP 404"),
    ):
        anything.register(f"{server}/absent.mar")
    with pytest.raises(StoreError, match="Weir downloads archives by HTTP"):
        anything.register(f"file://{tmp_path}/echo.mar")
    assert leftovers(anything) == []


def test_a_download_past_its_limit_is_refused_and_leaves_nothing(
    tmp_path: Path, server: str
) -> None:
    store = store_at(tmp_path, max_bytes=64)
    with pytest.raises(StoreError, match="it is over 64 bytes"):
        store.register(f"{server}/echo.mar")
    assert leftovers(store) == []


def test_without_downloads_a_url_is_refused_as_before(tmp_path: Path, server: str) -> None:
    (tmp_path / "store").mkdir()
    store = ModelStore(tmp_path / "store", tmp_path / "store" / ".weir")
    with pytest.raises(StoreError, match="Weir does not download model archives"):
        store.register(f"{server}/echo.mar")


def test_bad_patterns_are_a_clear_error() -> None:
    with pytest.raises(
        StoreError, match=re.escape("allowed_urls: 'http(s' is no regular expression")
    ):
        Downloads.of("http(s", 1, 1.0)
