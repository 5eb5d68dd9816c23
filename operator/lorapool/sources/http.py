"""``https://`` and ``http://`` sources (aiohttp).

A URL whose path ends in .tar.gz/.tgz/.tar/.zip is one archive; any other URL is a
"directory": ``<url>/adapter_config.json`` and ``<url>/adapter_model.safetensors``
(falling back to ``adapter_model.bin`` on 404) are fetched, the query string kept so
pre-signed URLs work. Basic auth in the URL is honoured; URLs are redacted in messages.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from lorapool.errors import AdapterError, SourceError
from lorapool.sources import archive
from lorapool.sources.base import Deadline, Downloaded, Limits, Sink, redact_url
from lorapool.sources.layout import BIN_FILE, CONFIG_FILE, SAFETENSORS_FILE, parse_config_bytes

_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class _NotFound(SourceError):
    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class HttpSource:
    """An adapter served over HTTP(S), as one archive or as a directory of files."""

    def __init__(self, url: str, revision: str | None) -> None:
        self.url = url
        self.revision = revision
        self.kind = archive.archive_kind(urlsplit(url).path)

    def describe(self) -> str:
        return redact_url(self.url)

    def file_url(self, name: str) -> str:
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/") + "/" + name, parts.query, ""))

    def _session(self, limits: Limits) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=limits.connect_timeout_s, sock_read=limits.read_timeout_s
        )
        return aiohttp.ClientSession(timeout=timeout, raise_for_status=False)

    async def _get(
        self,
        session: aiohttp.ClientSession,
        url: str,
        dest: Path,
        *,
        limit: int,
        deadline: Deadline,
    ) -> Sink:
        where = redact_url(url)
        try:
            async with asyncio.timeout(deadline.remaining()), session.get(url) as resp:
                if resp.status == 404:
                    raise _NotFound(f"{where}: 404 Not Found; publish the file or fix the source URL")
                if resp.status != 200:
                    fix = "retrying" if resp.status in _TRANSIENT_STATUS else "check the URL and its credentials"
                    raise SourceError(
                        f"{where}: HTTP {resp.status} {resp.reason}; {fix}",
                        transient=resp.status in _TRANSIENT_STATUS,
                    )
                if resp.content_length is not None and resp.content_length > limit:
                    raise AdapterError(
                        f"{where}: {resp.content_length} bytes exceeds the limit of {limit}; "
                        "shrink the adapter or raise the download size limit"
                    )
                with dest.open("wb") as fh:
                    sink = Sink(fh, limit_bytes=limit, what=where, deadline=deadline)
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        sink.write(chunk)
                if resp.content_length is not None and sink.bytes != resp.content_length:
                    raise SourceError(
                        f"{where}: connection closed after {sink.bytes} of {resp.content_length} bytes; retrying"
                    )
                return sink
        except TimeoutError as exc:
            raise SourceError(f"{where}: timed out; check the server or raise the timeout") from exc
        except aiohttp.ClientError as exc:
            raise SourceError(f"{where}: {type(exc).__name__}: {exc}; retrying".replace(self.url, where)) from exc

    async def fetch_config(self, *, limits: Limits) -> dict[str, Any]:
        deadline = Deadline(limits.config_timeout_s, f"{self.describe()}: {CONFIG_FILE}")
        with tempfile.TemporaryDirectory(prefix="lorapool-config-") as tmp:
            async with self._session(limits) as session:
                if self.kind is None:
                    dest = Path(tmp) / CONFIG_FILE
                    await self._get(
                        session,
                        self.file_url(CONFIG_FILE),
                        dest,
                        limit=limits.max_config_bytes,
                        deadline=deadline,
                    )
                    return parse_config_bytes(dest.read_bytes(), where=self.describe())
                # An archive has no cheap way in: fetch it, extract only the config.
                dest = Path(tmp) / "archive"
                await self._get(session, self.url, dest, limit=limits.max_bytes, deadline=deadline)
            out = Path(tmp) / "tree"
            out.mkdir()
            await asyncio.to_thread(
                archive.extract,
                dest,
                out,
                limits=limits,
                where=self.describe(),
                kind=self.kind,
                config_only=True,
            )
            found = sorted(out.rglob(CONFIG_FILE), key=lambda p: len(p.parts))
            if not found:
                raise AdapterError(f"{self.describe()}: the archive holds no {CONFIG_FILE}; add it")
            return parse_config_bytes(found[0].read_bytes(), where=self.describe())

    async def download(self, into: Path, *, limits: Limits) -> Downloaded:
        deadline = Deadline(limits.total_timeout_s, f"{self.describe()}: download")
        tree = into / "tree"
        tree.mkdir()
        async with self._session(limits) as session:
            if self.kind is not None:
                dest = into / "archive"
                sink = await self._get(session, self.url, dest, limit=limits.max_bytes, deadline=deadline)
                await asyncio.to_thread(
                    archive.extract,
                    dest,
                    tree,
                    limits=limits,
                    where=self.describe(),
                    kind=self.kind,
                    deadline=deadline,
                )
                dest.unlink()
                return Downloaded(root=tree, bytes=sink.bytes, archive_sha256=sink.sha256)
            total = (
                await self._get(
                    session,
                    self.file_url(CONFIG_FILE),
                    tree / CONFIG_FILE,
                    limit=limits.max_config_bytes,
                    deadline=deadline,
                )
            ).bytes
            for weights in (SAFETENSORS_FILE, BIN_FILE):  # PEFT's file, else the older torch one
                try:
                    sink = await self._get(
                        session,
                        self.file_url(weights),
                        tree / weights,
                        limit=limits.max_bytes - total,
                        deadline=deadline,
                    )
                    break
                except _NotFound:
                    (tree / weights).unlink(missing_ok=True)
            else:
                raise _NotFound(
                    f"{self.describe()}: "
                    f"neither {SAFETENSORS_FILE} nor {BIN_FILE} found under the URL; "
                    "publish the adapter weights there"
                )
            return Downloaded(root=tree, bytes=total + sink.bytes)
