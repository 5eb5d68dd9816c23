"""Safe archive extraction and adapter layout: what is refused, what is kept."""

from __future__ import annotations

import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from source_helpers import make_tar, tar_of_dir, zip_of_dir

from lorapool.errors import AdapterError, UnsafePathError
from lorapool.sources.archive import archive_kind, extract, member_path
from lorapool.sources.base import Limits
from lorapool.sources.layout import (
    check_name,
    check_safetensors,
    find_adapter_root,
    pick_files,
)

LIMITS = Limits()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("adapter_config.json", "adapter_config.json"),
        ("./a/b.json", "a/b.json"),
        ("a//b", "a/b"),
        ("./", "."),
    ],
)
def test_member_path_accepts_relative_names(name: str, expected: str) -> None:
    assert str(member_path(name, where="t")) == expected


@pytest.mark.parametrize(
    "name",
    ["/etc/passwd", "../x", "a/../../x", "a/..", "C:/x", "..\\x", "a\x00b"],
    ids=["absolute", "dotdot", "nested-dotdot", "trailing-dotdot", "drive", "backslash", "nul"],
)
def test_member_path_refuses_escapes(name: str) -> None:
    with pytest.raises(UnsafePathError):
        member_path(name, where="t")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("sql", True),
        ("a-1", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("../x", False),
        ("Sql", False),
        ("-a", False),
        ("a-", False),
        ("a/b", False),
        ("", False),
        (".store", False),
    ],
)
def test_check_name_is_dns1123(name: str, ok: bool) -> None:
    if ok:
        assert check_name(name) == name
    else:
        with pytest.raises(UnsafePathError, match="DNS-1123"):
            check_name(name)


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/a/x.tar.gz", "tar"), ("X.TGZ", "tar"), ("a.tar", "tar"), ("a.zip", "zip"), ("a/dir", None), ("a.gz", None)],
)
def test_archive_kind_by_suffix(path: str, kind: str | None) -> None:
    assert archive_kind(path) == kind


def _symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


def _hardlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE
    info.linkname = target
    return info


def _special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


@pytest.mark.parametrize(
    ("member", "match"),
    [
        (("/abs/adapter_config.json", b"{}"), "absolute"),
        (("../adapter_config.json", b"{}"), r"'\.\.'"),
        (("a/../../evil", b"x"), r"'\.\.'"),
        (_symlink("adapter_model.safetensors", "/etc/passwd"), "outside the archive"),
        (_symlink("a/adapter_model.safetensors", "../../x"), "outside the archive"),
        (_hardlink("adapter_model.safetensors", "../x"), "outside the archive"),
        (_special("dev", tarfile.CHRTYPE), "device"),
        (_special("blk", tarfile.BLKTYPE), "device"),
        (_special("fifo", tarfile.FIFOTYPE), "device"),
    ],
    ids=[
        "absolute",
        "dotdot",
        "nested-dotdot",
        "symlink-abs",
        "symlink-up",
        "hardlink-up",
        "chardev",
        "blockdev",
        "fifo",
    ],
)
def test_unsafe_tar_members_refuse_the_whole_archive(
    tmp_path: Path, adapter: Path, member: tarfile.TarInfo | tuple[str, bytes], match: str
) -> None:
    members = [(f.name, f.read_bytes()) for f in adapter.iterdir()]
    archive = make_tar(tmp_path / "a.tgz", [*members, member])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(UnsafePathError, match=match):
        extract(archive, out, limits=LIMITS, where="a.tgz")
    assert not (tmp_path / "evil").exists()
    assert not (tmp_path.parent / "adapter_config.json").exists()


def test_zip_traversal_and_symlink_out_are_refused(tmp_path: Path) -> None:
    traversal = tmp_path / "t.zip"
    with zipfile.ZipFile(traversal, "w") as zf:
        zf.writestr("../adapter_config.json", "{}")
    link = tmp_path / "l.zip"
    with zipfile.ZipFile(link, "w") as zf:
        info = zipfile.ZipInfo("adapter_model.safetensors")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "../../etc/passwd")
    for archive in (traversal, link):
        out = tmp_path / f"out-{archive.stem}"
        out.mkdir()
        with pytest.raises(UnsafePathError):
            extract(archive, out, limits=LIMITS, where=archive.name)


def test_in_archive_link_to_a_kept_file_becomes_a_copy(tmp_path: Path, adapter: Path) -> None:
    archive = make_tar(
        tmp_path / "a.tgz",
        [
            ("blobs/abc", (adapter / "adapter_model.safetensors").read_bytes()),
            ("x/adapter_config.json", (adapter / "adapter_config.json").read_bytes()),
            _symlink("x/adapter_model.safetensors", "../blobs/abc"),
        ],
    )
    out = tmp_path / "out"
    out.mkdir()
    extract(archive, out, limits=LIMITS, where="a.tgz")
    weights = out / "x" / "adapter_model.safetensors"
    assert weights.is_file() and not weights.is_symlink()
    assert weights.read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()
    assert not (out / "blobs").exists()  # not a kept file name


@pytest.mark.parametrize("builder", [tar_of_dir, zip_of_dir], ids=["tar", "zip"])
def test_extract_keeps_only_adapter_files_under_a_wrapping_folder(
    tmp_path: Path, adapter: Path, builder: Callable[..., Path]
) -> None:
    (adapter / "README.md").write_text("hello")
    (adapter / "training_args.bin").write_bytes(b"x" * 100)
    archive = builder(tmp_path / ("a.tgz" if builder is tar_of_dir else "a.zip"), adapter, prefix="my-adapter/")
    out = tmp_path / "out"
    out.mkdir()
    extract(archive, out, limits=LIMITS, where="a")
    root = find_adapter_root(out, where="a")
    assert root == out / "my-adapter"
    assert sorted(p.name for p in root.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert sorted(pick_files(root, where="a")) == ["adapter_config.json", "adapter_model.safetensors"]


def test_size_limit_stops_a_decompression_bomb(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "bomb.tgz", [("adapter_model.safetensors", b"\0" * 5_000_000)])
    assert archive.stat().st_size < 50_000
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(AdapterError, match="larger than the limit"):
        extract(archive, out, limits=Limits(max_bytes=1_000_000), where="bomb.tgz")


def test_member_count_limit(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "many.tar", [(f"f{i}", b"") for i in range(20)], mode="w")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(AdapterError, match="more than 10 entries"):
        extract(archive, out, limits=Limits(max_members=10), where="many.tar")


@pytest.mark.parametrize("suffix", ["tgz", "zip"])
def test_corrupt_archive_is_an_adapter_error(tmp_path: Path, adapter: Path, suffix: str) -> None:
    good = (tar_of_dir if suffix == "tgz" else zip_of_dir)(tmp_path / f"a.{suffix}", adapter)
    bad = tmp_path / f"bad.{suffix}"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2] if suffix == "tgz" else data[:40] + b"\xff" * 64 + data[104:])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(AdapterError, match="corrupt or truncated"):
        extract(bad, out, limits=LIMITS, where=bad.name, kind="zip" if suffix == "zip" else "tar")


def test_two_adapters_in_one_archive_are_ambiguous(tmp_path: Path, adapter: Path) -> None:
    for sub in ("a", "b"):
        (tmp_path / "tree" / sub).mkdir(parents=True)
        (tmp_path / "tree" / sub / "adapter_config.json").write_text("{}")
    with pytest.raises(AdapterError, match="several adapters"):
        find_adapter_root(tmp_path / "tree", where="x")


def test_missing_weights_and_config_say_what_to_upload(tmp_path: Path, adapter: Path) -> None:
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="upload the adapter weights"):
        pick_files(adapter, where="x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match=r"no adapter_config\.json found"):
        find_adapter_root(tmp_path / "empty", where="x")


def test_truncated_safetensors_is_refused(adapter: Path) -> None:
    weights = adapter / "adapter_model.safetensors"
    check_safetensors(weights, where="x")
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(AdapterError, match="truncated or corrupt"):
        check_safetensors(weights, where="x")
    weights.write_bytes(b"garbage!" * 4)
    with pytest.raises(AdapterError, match="not a safetensors file"):
        check_safetensors(weights, where="x")
