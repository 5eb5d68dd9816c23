"""``file:///abs/path`` and ``pvc://claim/path`` sources: a directory or an archive file on
a mounted filesystem. pvc paths resolve under ``SourceOptions.pvc_root`` and may not
leave their claim, not even through symlinks. Blocking work runs in a thread.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from lorapool.api import schemes
from lorapool.api.common import DNS1123_SUBDOMAIN_PATTERN
from lorapool.errors import AdapterError, SourceError, UnsafePathError
from lorapool.sources import archive
from lorapool.sources.base import Deadline, Downloaded, Limits, Sink, SourceOptions
from lorapool.sources.layout import CONFIG_FILE, KEPT_FILES, parse_config_bytes

_CLAIM = re.compile(DNS1123_SUBDOMAIN_PATTERN)


class LocalSource:
    """A path on this machine; ``confine`` is the directory it may not escape (pvc)."""

    def __init__(self, url: str, revision: str | None, *, path: Path, confine: Path | None) -> None:
        self.url = url
        self.revision = revision
        self.path = path
        self.confine = confine

    @classmethod
    def from_url(cls, url: str, revision: str | None, options: SourceOptions) -> LocalSource:
        parts = urlsplit(url)
        if parts.scheme in schemes.FILE.uri_schemes:
            if parts.netloc not in ("", "localhost"):
                raise SourceError(
                    f"{url}: file:// URLs name a local path; write file:///abs/path",
                    transient=False,
                )
            return cls(url, revision, path=Path(unquote(parts.path)), confine=None)
        claim = parts.netloc
        if not _CLAIM.match(claim):
            raise UnsafePathError(f"{url}: {claim!r} is not a valid PersistentVolumeClaim name; fix the source")
        sub = archive.member_path(unquote(parts.path).lstrip("/"), where=url, what="path")
        root = options.pvc_root / claim
        return cls(url, revision, path=root.joinpath(*sub.parts), confine=root)

    def describe(self) -> str:
        return self.url

    def _resolve(self, path: Path) -> Path:
        resolved = path.resolve()
        if self.confine is not None and not resolved.is_relative_to(self.confine.resolve()):
            raise UnsafePathError(f"{self.url}: {path} resolves outside the claim to {resolved}; remove the symlink")
        if not resolved.exists():
            raise SourceError(f"{self.url}: {path} does not exist; copy the adapter there or fix the source")
        return resolved

    def _copy(self, src: Path, dst: Path, *, limit: int, deadline: Deadline) -> Sink:
        with src.open("rb") as fin, dst.open("wb") as fout:
            sink = Sink(fout, limit_bytes=limit, what=f"{self.url}: {src.name}", deadline=deadline)
            while chunk := fin.read(1 << 20):
                sink.write(chunk)
        return sink

    def _fetch_config(self, limits: Limits) -> dict[str, Any]:
        path = self._resolve(self.path)
        kind = archive.archive_kind(path.name)
        if path.is_dir():
            config = self._resolve(path / CONFIG_FILE)
            if config.stat().st_size > limits.max_config_bytes:
                raise AdapterError(
                    f"{self.url}: {CONFIG_FILE} exceeds {limits.max_config_bytes} bytes; it is not a PEFT config"
                )
            return parse_config_bytes(config.read_bytes(), where=self.url)
        if kind is None:
            raise AdapterError(
                f"{self.url}: not a directory nor a .tar.gz/.tgz/.tar/.zip archive; point the source at one"
            )
        with tempfile.TemporaryDirectory(prefix="lorapool-config-") as tmp:
            archive.extract(path, Path(tmp), limits=limits, where=self.url, kind=kind, config_only=True)
            found = sorted(Path(tmp).rglob(CONFIG_FILE), key=lambda p: len(p.parts))
            if not found:
                raise AdapterError(f"{self.url}: the archive holds no {CONFIG_FILE}; add it")
            return parse_config_bytes(found[0].read_bytes()[: limits.max_config_bytes + 1], where=self.url)

    def _download(self, into: Path, limits: Limits) -> Downloaded:
        deadline = Deadline(limits.total_timeout_s, f"{self.url}: download")
        path = self._resolve(self.path)
        tree = into / "tree"
        tree.mkdir()
        if path.is_dir():
            total = 0
            for entry in sorted(path.iterdir()):
                if entry.name not in KEPT_FILES:
                    continue
                src = self._resolve(entry)
                if not src.is_file():
                    continue
                total += self._copy(src, tree / entry.name, limit=limits.max_bytes - total, deadline=deadline).bytes
            return Downloaded(root=tree, bytes=total)
        kind = archive.archive_kind(path.name)
        if kind is None:
            raise AdapterError(
                f"{self.url}: not a directory nor a .tar.gz/.tgz/.tar/.zip archive; point the source at one"
            )
        copy = into / ("archive" + ("".join(path.suffixes[-2:]) if kind == "tar" else ".zip"))
        sink = self._copy(path, copy, limit=limits.max_bytes, deadline=deadline)
        archive.extract(copy, tree, limits=limits, where=self.url, kind=kind, deadline=deadline)
        copy.unlink()
        return Downloaded(root=tree, bytes=sink.bytes, archive_sha256=sink.sha256)

    async def fetch_config(self, *, limits: Limits) -> dict[str, Any]:
        return await asyncio.to_thread(self._fetch_config, limits)

    async def download(self, into: Path, *, limits: Limits) -> Downloaded:
        return await asyncio.to_thread(self._download, into, limits)
