"""Adapter sources shared by the operator and the sidecar.

Public surface:
  * ``fetch_adapter_config(source, *, revision=None, timeout_s=30.0, ...)`` -> dict:
    an adapter's adapter_config.json (async, timed out, TTL-cached); the operator's call.
  * ``Downloader(store).fetch(name, source, revision=..., sha256=...)`` -> ``Fetched``:
    download, verify and store an adapter (the sidecar's call); sha256 semantics are in
    ``lorapool.sources.download``.
  * ``open_source(url, revision=...)`` -> ``Source``: the scheme registry.
  * ``AdapterStore``: the content-addressed store on the adapter volume.
Schemes: file://, pvc://claim/path, http(s)://, s3://bucket/prefix, hf://org/repo[@rev].
"""

from lorapool.sources.base import Downloaded, Limits, Source, SourceOptions, redact_url
from lorapool.sources.config import ConfigCache, fetch_adapter_config
from lorapool.sources.download import ChecksumMismatch, Downloader, Fetched
from lorapool.sources.layout import check_name
from lorapool.sources.registry import open_source
from lorapool.sources.store import AdapterStore, Origin, adapter_identity

__all__ = [
    "AdapterStore",
    "ChecksumMismatch",
    "ConfigCache",
    "Downloaded",
    "Downloader",
    "Fetched",
    "Limits",
    "Origin",
    "Source",
    "SourceOptions",
    "adapter_identity",
    "check_name",
    "fetch_adapter_config",
    "open_source",
    "redact_url",
]
