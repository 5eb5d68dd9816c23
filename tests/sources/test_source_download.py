"""Downloader over file://, pvc:// and http://: verified, atomic, bounded, reusable."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest
from loopback_http import LoopbackServer
from source_helpers import make_tar, tar_of_dir, zip_of_dir

from lorapool.errors import AdapterError, SourceError, UnsafePathError
from lorapool.sources import AdapterStore, Downloader, Limits, SourceOptions
from lorapool_dev.testing.peft import write_peft_adapter


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def store(tmp_path: Path) -> AdapterStore:
    return AdapterStore(tmp_path / "adapters")


def test_file_directory_is_copied_with_only_adapter_files(store: AdapterStore, adapter: Path) -> None:
    (adapter / "optimizer.pt").write_bytes(b"x" * 1000)
    (adapter / "tokenizer.json").write_text("{}")
    fetched = asyncio.run(Downloader(store).fetch("sql", f"file://{adapter}"))
    assert sorted(p.name for p in fetched.path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
    ]
    assert fetched.config["r"] == 8
    assert fetched.path.parent == store.store_dir and fetched.path.name == fetched.origin.digest
    assert fetched.cached is False and fetched.bytes > 0


@pytest.mark.parametrize("kind", ["tgz", "zip"])
def test_sha256_of_an_archive_source_is_the_archive_bytes(
    store: AdapterStore, tmp_path: Path, adapter: Path, kind: str
) -> None:
    archive = (tar_of_dir if kind == "tgz" else zip_of_dir)(tmp_path / f"a.{kind}", adapter, prefix="sql/")
    down = Downloader(store)
    ok = asyncio.run(down.fetch("sql", f"file://{archive}", sha256=_sha(archive)))
    assert ok.config["r"] == 8
    weights_sha = _sha(adapter / "adapter_model.safetensors")
    with pytest.raises(AdapterError, match="sha256 mismatch for the archive bytes") as err:
        asyncio.run(down.fetch("sql2", f"file://{archive}", sha256=weights_sha))
    assert "update the adapter's sha256" in str(err.value)


def test_sha256_of_a_directory_source_is_the_weights_file(store: AdapterStore, adapter: Path) -> None:
    down = Downloader(store)
    asyncio.run(down.fetch("sql", f"file://{adapter}", sha256=_sha(adapter / "adapter_model.safetensors")))
    with pytest.raises(AdapterError, match=r"sha256 mismatch for adapter_model\.safetensors"):
        asyncio.run(down.fetch("sql2", f"file://{adapter}", sha256="0" * 64))
    # Nothing half-written is left behind: only the verified download is in the store.
    assert len(list(store.store_dir.iterdir())) == 1
    assert list(store.staging_dir.iterdir()) == []


def test_unchanged_identity_is_served_from_the_store(store: AdapterStore, adapter: Path) -> None:
    down = Downloader(store)
    first = asyncio.run(down.fetch("sql", f"file://{adapter}", revision="v1"))
    store.point("sql", first.origin)
    down.release(first)
    again = asyncio.run(down.fetch("sql", f"file://{adapter}", revision="v1"))
    assert again.cached and again.bytes == 0 and again.path == first.path
    changed = asyncio.run(down.fetch("sql", f"file://{adapter}", revision="v2"))
    assert not changed.cached


def test_pvc_resolves_under_the_mount_root_and_stays_in_its_claim(
    store: AdapterStore, tmp_path: Path, adapter: Path
) -> None:
    root = tmp_path / "pvc"
    (root / "claim-a" / "team").mkdir(parents=True)
    os.symlink(adapter, root / "claim-a" / "team" / "sql")
    (root / "claim-a" / "good").mkdir()
    for f in adapter.iterdir():
        (root / "claim-a" / "good" / f.name).write_bytes(f.read_bytes())
    down = Downloader(store, options=SourceOptions(pvc_root=root))
    assert asyncio.run(down.fetch("good", "pvc://claim-a/good")).config["r"] == 8
    with pytest.raises(UnsafePathError, match="outside the claim"):
        asyncio.run(down.fetch("sql", "pvc://claim-a/team/sql"))
    with pytest.raises(UnsafePathError):
        asyncio.run(down.fetch("sql", "pvc://claim-a/../claim-b/x"))
    with pytest.raises(SourceError, match="does not exist") as err:
        asyncio.run(down.fetch("sql", "pvc://claim-a/missing"))
    assert err.value.transient


def test_unsafe_archive_is_refused_and_nothing_escapes(store: AdapterStore, tmp_path: Path, adapter: Path) -> None:
    archive = make_tar(
        tmp_path / "evil.tgz",
        [(f.name, f.read_bytes()) for f in adapter.iterdir()] + [("../../escaped", b"x")],
    )
    with pytest.raises(UnsafePathError, match=r"contains '\.\.'"):
        asyncio.run(Downloader(store).fetch("sql", f"file://{archive}"))
    assert not list(tmp_path.rglob("escaped"))
    assert list(store.store_dir.iterdir()) == []


def test_bad_name_is_refused_before_any_download(store: AdapterStore, http_server: LoopbackServer) -> None:
    with pytest.raises(UnsafePathError, match="DNS-1123"):
        asyncio.run(Downloader(store).fetch("../x", f"{http_server.url}/a.tgz"))
    assert not http_server.hits


def test_http_archive_and_directory(
    store: AdapterStore, tmp_path: Path, adapter: Path, http_server: LoopbackServer
) -> None:
    archive = tar_of_dir(tmp_path / "a.tar.gz", adapter)
    http_server.add_file("/adapters/sql.tar.gz", archive)
    http_server.add_dir("/dirs/sql", adapter)
    down = Downloader(store)
    a = asyncio.run(down.fetch("a", f"{http_server.url}/adapters/sql.tar.gz", sha256=_sha(archive)))
    d = asyncio.run(
        down.fetch("d", f"{http_server.url}/dirs/sql?sig=secret", sha256=_sha(adapter / "adapter_model.safetensors"))
    )
    assert a.origin.digest == d.origin.digest  # same files -> same store entry
    assert "sig=secret" in http_server.queries  # the query string reaches the server...
    assert "secret" not in d.origin.source  # ...but never the store's metadata


def test_http_directory_falls_back_to_bin_weights(
    store: AdapterStore, tmp_path: Path, http_server: LoopbackServer
) -> None:
    http_server.routes["/bin/adapter_config.json"] = b'{"r": 4, "target_modules": ["q_proj"]}'
    http_server.routes["/bin/adapter_model.bin"] = b"PK-not-really-a-pickle"
    fetched = asyncio.run(Downloader(store).fetch("b", f"{http_server.url}/bin"))
    assert sorted(p.name for p in fetched.path.iterdir()) == ["adapter_config.json", "adapter_model.bin"]


def test_parallel_downloads_are_bounded(store: AdapterStore, tmp_path: Path, http_server: LoopbackServer) -> None:
    for i in range(6):
        src = write_peft_adapter(tmp_path / f"a{i}", rank=8, seed=i)
        http_server.add_file(f"/a{i}.tgz", tar_of_dir(tmp_path / f"a{i}.tgz", src))
    http_server.delay_s = 0.2
    down = Downloader(store, parallel=2)

    async def all_of_them() -> None:
        await asyncio.gather(*(down.fetch(f"a{i}", f"{http_server.url}/a{i}.tgz") for i in range(6)))

    asyncio.run(all_of_them())
    assert http_server.max_active == 2
    assert len(list(store.store_dir.iterdir())) == 6


def test_size_limit_applies_to_downloads(store: AdapterStore, adapter: Path, http_server: LoopbackServer) -> None:
    http_server.add_dir("/big", adapter)
    with pytest.raises(AdapterError, match="raise the download size limit"):
        asyncio.run(Downloader(store, limits=Limits(max_bytes=1000)).fetch("big", f"{http_server.url}/big"))
