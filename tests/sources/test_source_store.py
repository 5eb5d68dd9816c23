"""The content-addressed store: digest formula, atomic pointers, pins and gc."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from lorapool.errors import UnsafePathError
from lorapool.sources.store import AdapterStore, Origin, tree_digest, tree_manifest


def _origin(digest: str, identity: str = "i") -> Origin:
    return Origin(identity, "file:///x", None, None, digest, "2026-01-01T00:00:00Z")


def _copy(adapter: Path, tmp: Path) -> dict[str, Path]:
    out = tmp / f"copy-{len(list(tmp.iterdir()))}"
    shutil.copytree(adapter, out)
    return {p.name: p for p in out.iterdir()}


def test_digest_is_sha256sum_of_the_sorted_manifest(adapter: Path) -> None:
    files = {p.name: p for p in adapter.iterdir()}
    manifest = tree_manifest(files)
    lines = "".join(f"{hashlib.sha256((adapter / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(files))
    assert tree_digest(manifest) == hashlib.sha256(lines.encode()).hexdigest()


def test_put_point_current_and_gc(tmp_path: Path, adapter: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    files = _copy(adapter, scratch)
    digest = store.put(files, tree_manifest(files))
    assert sorted(p.name for p in store.path_of(digest).iterdir()) == sorted(files)
    assert store.gc() == []  # pinned: a download not yet pointed to survives gc
    path = store.point("sql", _origin(digest))
    store.unpin(digest)
    assert (tmp_path / "adapters" / "sql").resolve() == path.resolve()
    assert store.current("sql") == _origin(digest)
    assert store.gc() == []  # referenced by a name

    # Same content again: same directory, nothing new on disk.
    again = _copy(adapter, scratch)
    assert store.put(again, tree_manifest(again)) == digest
    store.unpin(digest)
    assert len(list(store.store_dir.iterdir())) == 1

    store.remove("sql")
    assert store.current("sql") is None
    assert store.gc() == [digest]
    assert not store.path_of(digest).exists()


def test_current_ignores_a_pointer_whose_content_is_gone(tmp_path: Path, adapter: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    (tmp_path / "s").mkdir()
    files = _copy(adapter, tmp_path / "s")
    digest = store.put(files, tree_manifest(files))
    store.point("sql", _origin(digest))
    shutil.rmtree(store.path_of(digest))
    assert store.current("sql") is None


def test_repointing_swaps_the_symlink_atomically(tmp_path: Path, adapter: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    (tmp_path / "s").mkdir()
    first = _copy(adapter, tmp_path / "s")
    d1 = store.put(first, tree_manifest(first))
    store.point("sql", _origin(d1))
    second = _copy(adapter, tmp_path / "s")
    second["adapter_config.json"].write_text('{"r": 8, "changed": true}')
    d2 = store.put(second, tree_manifest(second))
    store.point("sql", _origin(d2))
    store.unpin(d1)
    store.unpin(d2)
    assert os.readlink(tmp_path / "adapters" / "sql") == f".store/{d2}"
    assert store.gc() == [d1]
    assert not [p for p in (tmp_path / "adapters").iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", ["../evil", "a/b", ".store", "UP"])
def test_unsafe_names_never_touch_the_filesystem(tmp_path: Path, name: str) -> None:
    store = AdapterStore(tmp_path / "adapters")
    with pytest.raises(UnsafePathError):
        store.point(name, _origin("0" * 64))
    with pytest.raises(UnsafePathError):
        store.remove(name)
    assert not (tmp_path / "evil").exists()


def test_reset_staging_clears_interrupted_downloads(tmp_path: Path) -> None:
    store = AdapterStore(tmp_path / "adapters")
    leftover = store.staging()
    (leftover / "partial").write_bytes(b"x")
    store.reset_staging()
    assert list(store.staging_dir.iterdir()) == []
