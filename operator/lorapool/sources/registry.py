"""``open_source(url)``: the one place that maps a URL scheme to its Source class.

Scheme modules are imported on first use so the operator does not pay for boto3 or
huggingface_hub until an adapter needs them.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from lorapool.errors import SourceError
from lorapool.sources.base import Source, SourceOptions

SCHEMES = ("file", "pvc", "http", "https", "s3", "hf")


def open_source(url: str, *, revision: str | None = None, options: SourceOptions | None = None) -> Source:
    """The Source for ``url``; raises SourceError(transient=False) for an unknown scheme."""
    options = options or SourceOptions()
    scheme = urlsplit(url).scheme.lower()
    if scheme in ("file", "pvc"):
        from lorapool.sources.local import LocalSource

        return LocalSource.from_url(url, revision, options)
    if scheme in ("http", "https"):
        from lorapool.sources.http import HttpSource

        return HttpSource(url, revision)
    if scheme == "s3":
        from lorapool.sources.s3 import S3Source

        if not urlsplit(url).netloc:
            raise SourceError(f"{url}: expected s3://bucket/prefix", transient=False)
        return S3Source(url, revision)
    if scheme == "hf":
        from lorapool.sources.hf import HfSource

        return HfSource(url, revision)
    raise SourceError(
        f"{url.split('?')[0]}: unsupported source scheme {scheme!r}; use one of "
        + ", ".join(f"{s}://" for s in SCHEMES),
        transient=False,
    )
