"""``open_source(url)``: the one place that maps a scheme of the table (``lorapool.api.schemes``)
to its Source class.

Scheme modules are imported on first use so the operator does not pay for boto3 or
huggingface_hub until an adapter needs them. A scheme added to the table gets its opener in
``OPENERS``; ``tests/api/test_schemes.py`` fails until it has one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from lorapool.api import schemes
from lorapool.api.schemes import Scheme
from lorapool.errors import SourceError
from lorapool.sources.base import Source, SourceOptions

Opener = Callable[[str, str | None, SourceOptions], Source]


def _open_local(url: str, revision: str | None, options: SourceOptions) -> Source:
    from lorapool.sources.local import LocalSource

    return LocalSource.from_url(url, revision, options)


def _open_http(url: str, revision: str | None, options: SourceOptions) -> Source:
    from lorapool.sources.http import HttpSource

    return HttpSource(url, revision)


def _open_s3(url: str, revision: str | None, options: SourceOptions) -> Source:
    from lorapool.sources.s3 import S3Source

    if not urlsplit(url).netloc:
        raise SourceError(f"{url}: expected s3://bucket/prefix", transient=False)
    return S3Source(url, revision)


def _open_hf(url: str, revision: str | None, options: SourceOptions) -> Source:
    from lorapool.sources.hf import HfSource

    return HfSource(url, revision)


def _open_oci(url: str, revision: str | None, options: SourceOptions) -> Source:
    from lorapool.sources.oci import OciSource

    return OciSource.from_env(url, revision, plain_http=options.oci_plain_http)


# Every scheme's opener, in the order an unknown scheme's message lists them (local ones first).
OPENERS: Mapping[Scheme, Opener] = {
    schemes.FILE: _open_local,
    schemes.PVC: _open_local,  # the sidecar copies from the claim mounted under SourceOptions.pvc_root
    schemes.HTTPS: _open_http,
    schemes.S3: _open_s3,
    schemes.HF: _open_hf,
    schemes.OCI: _open_oci,
}

SCHEMES = tuple(uri_scheme for scheme in OPENERS for uri_scheme in scheme.uri_schemes)
"""Every URI scheme ``open_source`` opens: file, pvc, http, https, s3, hf, oci."""


def open_source(url: str, *, revision: str | None = None, options: SourceOptions | None = None) -> Source:
    """The Source for ``url``; raises SourceError(transient=False) for an unknown scheme."""
    options = options or SourceOptions()
    scheme = urlsplit(url).scheme.lower()
    entry = schemes.named(scheme)
    opener = OPENERS.get(entry) if entry is not None else None
    if opener is None:
        raise SourceError(
            f"{url.split('?')[0]}: unsupported source scheme {scheme!r}; use one of "
            + ", ".join(f"{s}://" for s in SCHEMES),
            transient=False,
        )
    return opener(url, revision, options)
