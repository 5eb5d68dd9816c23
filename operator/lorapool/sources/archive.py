"""Safe extraction of adapter archives (.tar.gz, .tgz, .tar, .zip).

Every member is checked before anything is written: absolute paths, ``..``, links that
point outside the archive and device files make the whole archive refused with
``UnsafePathError``. Only the files a PEFT adapter needs are written, with the
uncompressed size bounded, and nothing ever goes through ``TarFile.extract``.
Blocking; callers run it in a thread.
"""

from __future__ import annotations

import functools
import gzip
import lzma
import posixpath
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from lorapool.errors import AdapterError, UnsafePathError
from lorapool.sources.base import Deadline, Limits, Sink
from lorapool.sources.layout import CONFIG_FILE, KEPT_FILES

ARCHIVE_SUFFIXES: dict[str, str] = {".tar.gz": "tar", ".tgz": "tar", ".tar": "tar", ".zip": "zip"}
_DRIVE = re.compile(r"^[A-Za-z]:")


def archive_kind(path: str) -> str | None:
    """'tar' or 'zip' when ``path`` (a URL path or key) names an archive, else None."""
    lower = path.lower()
    for suffix, kind in ARCHIVE_SUFFIXES.items():
        if lower.endswith(suffix):
            return kind
    return None


def member_path(name: str, *, where: str, what: str = "archive member") -> PurePosixPath:
    """The relative path of an archive member (or URL path), or UnsafePathError if it could
    escape the directory it is joined to."""
    clean = name.replace("\\", "/")
    if "\x00" in clean or clean.startswith("/") or _DRIVE.match(clean):
        raise UnsafePathError(f"{where}: {what} {name!r} is an absolute path; use a relative path")
    parts = [p for p in clean.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(f"{where}: {what} {name!r} contains '..'; remove it")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _link_target(member: PurePosixPath, target: str, *, hard: bool, where: str) -> PurePosixPath:
    """Where a link lands, relative to the archive root; refuse targets outside it."""
    clean = target.replace("\\", "/")
    if not clean or clean.startswith("/") or _DRIVE.match(clean) or "\x00" in clean:
        raise UnsafePathError(
            f"{where}: archive link {str(member)!r} points to {target!r}, outside the archive; remove the link"
        )
    base = "" if hard else str(member.parent)  # tar hardlinks name a member, symlinks are relative
    joined = posixpath.normpath(posixpath.join(base, clean))
    if joined == ".." or joined.startswith("../"):
        raise UnsafePathError(
            f"{where}: archive link {str(member)!r} points to {target!r}, outside the archive; remove the link"
        )
    return PurePosixPath(joined)


class _Extractor:
    def __init__(
        self,
        dest: Path,
        *,
        limits: Limits,
        where: str,
        deadline: Deadline | None,
        wanted: frozenset[str],
    ) -> None:
        self.dest = dest
        self.limits = limits
        self.where = where
        self.deadline = deadline
        self.wanted = wanted
        self.written = 0
        self.members = 0
        self.regular: dict[PurePosixPath, Callable[[], IO[bytes]]] = {}
        self.links: dict[PurePosixPath, PurePosixPath] = {}

    def count(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise AdapterError(
                f"{self.where}: the archive has more than {self.limits.max_members} entries; "
                "ship only the adapter files"
            )

    def write(self, rel: PurePosixPath, opener: Callable[[], IO[bytes]]) -> None:
        self.regular[rel] = opener
        if rel.name in self.wanted:
            self._write(rel, opener)

    def _write(self, rel: PurePosixPath, opener: Callable[[], IO[bytes]]) -> None:
        out = self.dest.joinpath(*rel.parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        with opener() as stream, out.open("wb") as fh:
            sink = Sink(
                fh,
                limit_bytes=self.limits.max_bytes - self.written,
                what=f"{self.where}: {rel}",
                deadline=self.deadline,
            )
            while chunk := stream.read(1 << 20):
                sink.write(chunk)
        self.written += sink.bytes

    def finish(self) -> None:
        """Write in-archive links to kept files as copies of their targets (no links kept)."""
        for link, first in self.links.items():
            if link.name not in self.wanted:
                continue
            target, hops = first, 0
            while target in self.links and hops < 8:  # a link to a link
                target, hops = self.links[target], hops + 1
            if target in self.regular:
                self._write(link, self.regular[target])


def extract(
    archive: Path,
    dest: Path,
    *,
    limits: Limits,
    where: str,
    kind: str | None = None,
    deadline: Deadline | None = None,
    config_only: bool = False,
) -> None:
    """Extract the adapter files of ``archive`` into ``dest``; ``kind`` None sniffs the type."""
    if kind is None:
        kind = "zip" if zipfile.is_zipfile(archive) else "tar"
    wanted = frozenset({CONFIG_FILE}) if config_only else KEPT_FILES
    ex = _Extractor(dest, limits=limits, where=where, deadline=deadline, wanted=wanted)
    try:
        if kind == "zip":
            _extract_zip(archive, ex)
        else:
            _extract_tar(archive, ex)
    except (
        tarfile.TarError,
        EOFError,
        zlib.error,
        gzip.BadGzipFile,
        lzma.LZMAError,
        zipfile.BadZipFile,
    ) as exc:
        raise AdapterError(f"{where}: the archive is corrupt or truncated ({exc}); re-upload it") from exc
    except OSError as exc:
        if exc.errno is not None:  # a real filesystem error (disk full, ...), not bad data
            raise
        raise AdapterError(f"{where}: the archive is corrupt or truncated ({exc}); re-upload it") from exc


def _tar_stream(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    stream = tar.extractfile(member)
    if stream is None:  # only non-regular members have no data, and those never get here
        raise AdapterError(f"archive member {member.name!r} has no data; rebuild the archive")
    return stream


def _extract_tar(archive: Path, ex: _Extractor) -> None:
    with tarfile.open(archive, mode="r:*") as tar:
        for member in tar:
            ex.count()
            rel = member_path(member.name, where=ex.where)
            if member.isdir():
                continue
            if member.issym() or member.islnk():
                ex.links[rel] = _link_target(rel, member.linkname, hard=member.islnk(), where=ex.where)
                continue
            if not member.isreg():
                raise UnsafePathError(
                    f"{ex.where}: "
                    f"archive member {member.name!r} is a device, fifo or special file; "
                    "rebuild the archive with regular files only"
                )
            ex.write(rel, functools.partial(_tar_stream, tar, member))
        ex.finish()


def _extract_zip(archive: Path, ex: _Extractor) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            ex.count()
            rel = member_path(info.filename, where=ex.where)
            # Unix zips keep st_mode in the high bits; others carry no file type.
            mode = info.external_attr >> 16 if info.create_system == 3 else 0
            if info.is_dir() or stat.S_ISDIR(mode):
                continue
            if stat.S_ISLNK(mode):
                target = zf.read(info)[:4096].decode("utf-8", "replace")
                ex.links[rel] = _link_target(rel, target, hard=False, where=ex.where)
                continue
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG):
                raise UnsafePathError(
                    f"{ex.where}: "
                    f"archive member {info.filename!r} is a device, fifo or special file; "
                    "rebuild the archive with regular files only"
                )
            ex.write(rel, functools.partial(zf.open, info))
        ex.finish()
