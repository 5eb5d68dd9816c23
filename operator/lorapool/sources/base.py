"""What every adapter source shares: the ``Source`` protocol, limits, deadlines and a
bounded, hashing file sink. Used by the scheme modules, the store and the callers
(operator: ``fetch_adapter_config``; sidecar: ``Downloader``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit, urlunsplit

from lorapool.errors import AdapterError, SourceError

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Bounds on one adapter fetch. Defaults fit a rank-256 adapter of a 70B model."""

    max_bytes: int = 16 * GiB  # everything transferred for one adapter (archive or files)
    max_config_bytes: int = 1 * MiB  # adapter_config.json is small; a huge one is an attack
    max_members: int = 10_000  # archive entries scanned before refusing
    connect_timeout_s: float = 10.0  # TCP/TLS connect, per request
    read_timeout_s: float = 60.0  # a stalled read fails after this, per socket read
    total_timeout_s: float = 1800.0  # one whole download, all files included
    config_timeout_s: float = 30.0  # one fetch_config call


@dataclass(frozen=True)
class SourceOptions:
    """Deployment settings of sources (not per adapter)."""

    pvc_root: Path = Path("/mnt/pvc")  # pvc://claim/path resolves to <pvc_root>/<claim>/<path>
    oci_plain_http: frozenset[str] = frozenset()  # registries reached over HTTP, beside $LORAPOOL_OCI_PLAIN_HTTP


@dataclass(frozen=True)
class Downloaded:
    """What ``Source.download`` left in its staging directory."""

    root: Path  # the directory holding adapter_config.json (inside the staging directory)
    bytes: int  # bytes transferred from the source
    archive_sha256: str | None = None  # sha256 of the archive bytes when the source is one archive
    resolved_revision: str | None = None  # e.g. the Hugging Face commit a branch resolved to


class Source(Protocol):
    """One adapter location. Implementations never log and never write outside ``into``."""

    url: str
    revision: str | None

    def describe(self) -> str:
        """The URL with credentials and query strings removed: safe for logs and status."""
        ...

    async def fetch_config(self, *, limits: Limits) -> dict[str, Any]:
        """The adapter_config.json object, without downloading the weights where possible."""
        ...

    async def download(self, into: Path, *, limits: Limits) -> Downloaded:
        """Write the adapter into the empty directory ``into``; return where it ended up."""
        ...


def redact_url(url: str) -> str:
    """Drop userinfo, query and fragment: pre-signed URLs and basic auth carry secrets."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


class Deadline:
    """A wall-clock budget shared by every step of one operation."""

    def __init__(self, seconds: float, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.what = what
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - self._clock())

    def check(self) -> None:
        if self._clock() >= self._end:
            raise SourceError(
                f"{self.what}: timed out after {self.seconds:g}s; check the source's reachability or raise the timeout"
            )


class Sink:
    """Writes a stream to a file while counting and hashing it, enforcing size and time."""

    def __init__(self, fh: BinaryIO, *, limit_bytes: int, what: str, deadline: Deadline | None) -> None:
        self._fh = fh
        self._limit = limit_bytes
        self._what = what
        self._deadline = deadline
        self._hash = hashlib.sha256()
        self.bytes = 0

    def write(self, chunk: bytes) -> None:
        self.bytes += len(chunk)
        if self.bytes > self._limit:
            raise AdapterError(
                f"{self._what}: larger than the limit of {self._limit} bytes; "
                "shrink the adapter or raise the download size limit"
            )
        if self._deadline is not None:
            self._deadline.check()
        self._hash.update(chunk)
        self._fh.write(chunk)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()


def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()
