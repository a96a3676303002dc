"""The model store's books on disk: what a book written by an earlier Weir reads as."""

from __future__ import annotations

import json
from pathlib import Path

from tests.torchserve.archives import build_archive
from weir.config_parameters import LOAD_TIMEOUT_S
from weir.repository import load_model
from weir.torchserve.records import BOOK_DIR, Bookkeeping
from weir.torchserve.store import ModelStore


def test_a_book_written_before_the_startup_timeout_was_kept_still_reads(tmp_path: Path) -> None:
    build_archive(tmp_path, "noop")
    build_archive(tmp_path / "v2", "noop", version="2.0").rename(tmp_path / "noop_v2.mar")
    store = ModelStore(tmp_path, tmp_path / "repo")
    store.register("noop.mar", startup_timeout_s=90)
    path = store.repository / BOOK_DIR / "noop.json"
    old = json.loads(path.read_text())
    del old["versions"]["1"]["startup_timeout_s"]  # as books were written before it was kept
    path.write_text(json.dumps(old))
    assert Bookkeeping(store.repository).read("noop").versions["1"].startup_timeout_s == 120
    assert store.describe("noop").versions[0].startup_timeout_s == 120  # TorchServe's default
    # A later version takes its own; the rewritten book keeps the field for both.
    store.register("noop_v2.mar", startup_timeout_s=60)
    assert [v.startup_timeout_s for v in store.describe("noop").versions] == [120, 60]
    assert json.loads(path.read_text())["versions"]["1"]["startup_timeout_s"] == 120
    # The model's config is untouched: it keeps the timeout its first version was loaded with.
    assert load_model(store.repository, "noop").config.parameters[LOAD_TIMEOUT_S] == "90"
