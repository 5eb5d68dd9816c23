"""The store's kept trees: an unloaded adapter's files kept by identity, taken back, forgotten, gc'd,
and read the same after a restart."""

from __future__ import annotations

import shutil
from pathlib import Path

from lorapool.sources.store import AdapterStore, Origin, tree_manifest


def _stored(store: AdapterStore, adapter: Path, scratch: Path, name: str, identity: str) -> Origin:
    copy = scratch / f"copy-{name}-{identity}"
    shutil.copytree(adapter, copy)
    files = {p.name: p for p in copy.iterdir()}
    digest = store.put(files, tree_manifest(files))
    origin = Origin(identity, "s3://adapters/x", None, None, digest, "2026-01-01T00:00:00Z")
    store.point(name, origin)
    store.unpin(digest)
    return origin


def test_keep_take_back_and_forget(tmp_path: Path, adapter: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    origin = _stored(store, adapter, tmp_path, "sql", "id-1")
    size = sum(p.stat().st_size for p in adapter.iterdir())

    kept = store.keep("sql", now=100.0)
    assert kept is not None and (kept.name, kept.identity, kept.bytes, kept.kept_at) == ("sql", "id-1", size, 100.0)
    assert store.current("sql") is None and store.names() == []
    assert store.gc() == [] and store.path_of(origin.digest).is_dir()  # kept: gc spares it
    assert store.kept() == [kept]

    assert store.take_kept("sql", "id-other") is None
    assert store.take_kept("sql", "id-1") == kept
    assert store.current("sql") == origin and store.kept() == []

    assert store.keep("sql", now=200.0) is not None
    store.forget(store.kept())
    assert store.gc() == [origin.digest] and not store.path_of(origin.digest).exists()


def test_keep_of_a_name_without_files_only_drops_it(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    assert store.keep("sql", now=1.0) is None and store.kept() == []


def test_forget_spares_a_tree_kept_again_since_it_was_read(tmp_path: Path, adapter: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    _stored(store, adapter, tmp_path, "sql", "id-1")
    first = store.keep("sql", now=1.0)
    assert first is not None and store.take_kept("sql", "id-1") is not None
    store.keep("sql", now=2.0)
    store.forget([first])
    assert [t.kept_at for t in store.kept()] == [2.0]


def test_a_tree_in_use_under_another_name_outlives_its_record(tmp_path: Path, adapter: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    a = _stored(store, adapter, tmp_path, "a", "id-a")
    store.point("b", Origin("id-b", "file:///b", None, None, a.digest, "2026-01-01T00:00:00Z"))
    store.keep("a", now=1.0)
    assert a.digest in store.in_use()
    store.forget(store.kept())
    assert store.gc() == [] and store.current("b") is not None


def test_a_restart_keeps_whole_records_and_skips_the_rest(tmp_path: Path, adapter: Path) -> None:
    root = tmp_path / "adapters"
    store = AdapterStore(root)
    one = _stored(store, adapter, tmp_path, "one", "id-1")
    store.keep("one", now=5.0)
    (root / ".kept" / ".half.json.tmp").write_text("{")  # a record a crash cut short
    (root / ".kept" / "garbage.json").write_text("{")

    again = AdapterStore(root)  # the sidecar restarted
    again.reset_staging()
    assert [(t.identity, t.kept_at) for t in again.kept()] == [("id-1", 5.0)]
    assert not (root / ".kept" / ".half.json.tmp").exists()
    assert again.gc() == [] and again.take_kept("one", "id-1") is not None and again.current("one") == one

    again.keep("one", now=6.0)
    shutil.rmtree(again.path_of(one.digest))  # a tree gone behind the store's back: its record is skipped
    assert again.kept() == []
