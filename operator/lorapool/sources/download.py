"""``Downloader``: fetch an adapter from any source into the store, verified.

Called by the sidecar. Per adapter: check the name, download into a staging directory
(at most ``parallel`` at once), keep only the PEFT files, check their structure and their
tensors' names and shapes against the base model (``sources.verify``; ``base_shape`` None:
config and weights only), verify ``sha256`` and move the tree into the content-addressed store.
It does not judge the adapter against a pool's policy (rank limit, base model name, DoRA): that
is the caller's.

sha256 semantics (``DesiredAdapter.sha256``):
  * a source that is one archive (https/s3/file/pvc URL ending in .tar.gz, .tgz, .tar
    or .zip): the sha256 of the archive bytes as served (``sha256sum adapter.tgz``);
  * a directory source (file/pvc directory, https "directory" URL, s3 prefix, hf repo):
    the sha256 of the weights file vLLM loads, ``adapter_model.safetensors`` (or
    ``adapter_model.bin`` when there is no safetensors file). On the Hugging Face Hub
    this is the SHA256 shown for the LFS file.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lorapool.api.clock import rfc3339
from lorapool.errors import AdapterError, SourceError
from lorapool.sources.base import Downloaded, Limits, SourceOptions
from lorapool.sources.layout import (
    CONFIG_FILE,
    check_name,
    find_adapter_root,
    parse_config_bytes,
    pick_files,
    weights_name,
)
from lorapool.sources.registry import open_source
from lorapool.sources.store import AdapterStore, Origin, adapter_identity, tree_manifest
from lorapool.sources.verify import BaseShape, verify_adapter_dir


class ChecksumMismatch(AdapterError):
    """The downloaded bytes are not the ones ``sha256`` names."""


@dataclass(frozen=True)
class Fetched:
    """An adapter in the store, pinned until the caller ``release``s it."""

    name: str
    path: Path  # the store directory to hand to vLLM
    origin: Origin
    config: dict[str, Any]  # adapter_config.json
    bytes: int  # transferred; 0 when served from the store
    seconds: float
    cached: bool


class Downloader:
    """Bounded-parallel, verified, atomic downloads into an ``AdapterStore``."""

    def __init__(
        self,
        store: AdapterStore,
        *,
        limits: Limits | None = None,
        parallel: int = 4,
        options: SourceOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        base_shape: BaseShape | None = None,
    ) -> None:
        self.store = store
        self.base_shape = base_shape  # what every download is verified against; None: config and weights only
        self.limits = limits or Limits()
        self.options = options or SourceOptions()
        self._semaphore = asyncio.Semaphore(parallel)
        self._clock = clock

    async def fetch(
        self,
        name: str,
        source: str,
        *,
        revision: str | None = None,
        sha256: str | None = None,
        on_downloading: Callable[[], None] | None = None,
    ) -> Fetched:
        """The adapter ``name`` from ``source``, reusing the store when ``<name>`` already
        holds exactly this (source, revision, sha256). Raises AdapterError (fix the
        adapter), UnsafePathError (refused) or SourceError (``transient`` says retry)."""
        check_name(name)
        identity = adapter_identity(source, revision, sha256)
        started = self._clock()
        if (reused := await asyncio.to_thread(self._reuse, name, identity)) is not None:
            config = await asyncio.to_thread(self._read_config, name, reused)
            return Fetched(name, self.store.path_of(reused.digest), reused, config, 0, 0.0, cached=True)
        src = open_source(source, revision=revision, options=self.options)
        async with self._semaphore:
            if on_downloading is not None:
                on_downloading()
            staging = await asyncio.to_thread(self.store.staging)
            try:
                try:
                    downloaded = await asyncio.wait_for(
                        src.download(staging, limits=self.limits), self.limits.total_timeout_s + 5
                    )
                except TimeoutError as exc:
                    raise SourceError(
                        f"{src.describe()}: "
                        f"download timed out after {self.limits.total_timeout_s:g}s; "
                        "check the source's bandwidth or raise the timeout"
                    ) from exc
                origin, config = await asyncio.to_thread(
                    self._commit, name, src.describe(), revision, sha256, identity, downloaded
                )
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, True)
        return Fetched(
            name,
            self.store.path_of(origin.digest),
            origin,
            config,
            downloaded.bytes,
            self._clock() - started,
            cached=False,
        )

    def release(self, fetched: Fetched) -> None:
        """Unpin; call after ``store.point`` made the name refer to it, or on failure."""
        if not fetched.cached:
            self.store.unpin(fetched.origin.digest)

    def _reuse(self, name: str, identity: str) -> Origin | None:
        origin = self.store.current(name)
        return origin if origin is not None and origin.identity == identity else None

    def _read_config(self, name: str, origin: Origin) -> dict[str, Any]:
        path = self.store.path_of(origin.digest) / CONFIG_FILE
        return parse_config_bytes(path.read_bytes(), where=f"adapter {name!r}")

    def _commit(
        self,
        name: str,
        where: str,
        revision: str | None,
        sha256: str | None,
        identity: str,
        downloaded: Downloaded,
    ) -> tuple[Origin, dict[str, Any]]:
        root = find_adapter_root(downloaded.root, where=where)
        files = pick_files(root, where=where)
        if files[CONFIG_FILE].stat().st_size > self.limits.max_config_bytes:
            raise AdapterError(
                f"{where}: {CONFIG_FILE} exceeds {self.limits.max_config_bytes} bytes; it is not a PEFT config"
            )
        config = parse_config_bytes(files[CONFIG_FILE].read_bytes(), where=where)
        verify_adapter_dir(root, self.base_shape, where=where)  # before it can reach the store, so any load
        manifest = tree_manifest(files)
        if sha256 is not None:
            if downloaded.archive_sha256 is not None:
                actual, what = downloaded.archive_sha256, "the archive bytes"
            else:
                weights = weights_name(files)
                actual, what = manifest[weights], weights
            if actual != sha256.lower():
                raise ChecksumMismatch(
                    f"adapter {name!r}: sha256 mismatch for {what} of {where}: "
                    f"expected {sha256}, got {actual}; "
                    "the source changed or is corrupt: "
                    "fix the source or update the adapter's sha256"
                )
        digest = self.store.put(files, manifest)
        origin = Origin(
            identity=identity,
            source=where,
            revision=revision,
            resolved_revision=downloaded.resolved_revision,
            digest=digest,
            fetched_at=rfc3339(time.time()),
        )
        return origin, config
