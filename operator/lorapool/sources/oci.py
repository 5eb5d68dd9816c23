"""``oci://`` sources: an adapter in an OCI registry, pulled through the distribution API
(``lorapool.sources.oci_client``, which says why it is not oras-py).

Two packagings are read, and the CNCF ModelPack one falls out of the first:

* ORAS-style artifacts (what ``lorapool adapter push`` writes): each file one layer, named by its
  ``org.opencontainers.image.title`` annotation; a layer whose media type is not a tar is a file;
* image-packed adapters (``FROM scratch`` + ``COPY``): tar (or tar+gzip) layers holding the files,
  unpacked in order through ``sources/archive.py``'s safe extraction (traversal and links refused).

Identity: a tag is resolved to its manifest's digest once per download; the digest is returned as
``Downloaded.resolved_revision`` (the store's ``Origin``). The adapter's identity in the store is
its source as written, so a sidecar that holds ``:v1`` keeps the files it verified even when the
tag moves: a moved tag is picked up only as a new version (a new source or a digest pin), never
swapped under a loaded adapter. Pin ``@sha256:`` for one identity across replicas and restarts.

Settings come from the environment the renderer gives the sidecar (``spec.credentials.oci``):
``LORAPOOL_OCI_AUTH`` (a docker config document), ``LORAPOOL_OCI_PLAIN_HTTP`` (host[:port],
comma-separated) and ``LORAPOOL_OCI_CA_FILE`` (a PEM bundle for private registries).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lorapool.errors import AdapterError, SourceError
from lorapool.sources import archive
from lorapool.sources.base import Deadline, Downloaded, Limits
from lorapool.sources.layout import CONFIG_FILE, KEPT_FILES, parse_config_bytes
from lorapool.sources.oci_client import (
    INDEX_TYPES,
    Login,
    Reference,
    RegistryClient,
    login_for,
    parse_docker_config,
)

TITLE = "org.opencontainers.image.title"
AUTH_ENV = "LORAPOOL_OCI_AUTH"
PLAIN_HTTP_ENV = "LORAPOOL_OCI_PLAIN_HTTP"
CA_FILE_ENV = "LORAPOOL_OCI_CA_FILE"


@dataclass(frozen=True)
class Layer:
    """One layer of an adapter's manifest that we pull: a file (``name``, from its title) or a tar."""

    digest: str
    size: int
    tar: bool
    name: PurePosixPath | None  # the file's path for a file layer; None for a tar layer


def _is_tar(media_type: str) -> bool:
    return ".tar" in media_type or media_type.endswith("tar") or "rootfs.diff" in media_type


def plan_layers(manifest: dict[str, Any], *, where: str) -> list[Layer]:
    """The layers of ``manifest`` holding adapter files, refusing a manifest with none. Pure."""
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise AdapterError(f"{where}: the manifest has no layers; push the adapter with lorapool adapter push")
    planned: list[Layer] = []
    for desc in layers:
        if (
            not isinstance(desc, dict)
            or not isinstance(desc.get("digest"), str)
            or not isinstance(desc.get("size"), int)
        ):
            raise AdapterError(f"{where}: a layer descriptor lacks its digest or size; re-push the adapter")
        media_type = str(desc.get("mediaType", ""))
        title = (desc.get("annotations") or {}).get(TITLE)
        if _is_tar(media_type):
            if "zstd" in media_type:
                raise AdapterError(f"{where}: layer {desc['digest']} is zstd-compressed; push it as tar or tar+gzip")
            planned.append(Layer(desc["digest"], desc["size"], tar=True, name=None))
        elif isinstance(title, str):
            rel = archive.member_path(title, where=where, what="layer title")
            if rel.name in KEPT_FILES:
                planned.append(Layer(desc["digest"], desc["size"], tar=False, name=rel))
    if not any(layer.tar or (layer.name is not None and layer.name.name == CONFIG_FILE) for layer in planned):
        raise AdapterError(
            f"{where}: the manifest holds no adapter files (no layer titled {CONFIG_FILE}, no tar layer); "
            "push a PEFT directory with lorapool adapter push"
        )
    return planned


def pick_manifest(index: dict[str, Any], *, where: str) -> str:
    """The digest of the manifest to read from an index: the first that is not an attestation. Pure."""
    for desc in index.get("manifests") or []:
        platform = desc.get("platform") or {}
        if isinstance(desc, dict) and platform.get("os") != "unknown" and isinstance(desc.get("digest"), str):
            return str(desc["digest"])
    raise AdapterError(f"{where}: the index lists no manifest; push the adapter as one manifest")


class OciSource:
    """An adapter in an OCI registry."""

    def __init__(
        self,
        url: str,
        revision: str | None,
        *,
        docker_config: dict[str, Any] | None = None,
        login: Login | None = None,
        plain_http: frozenset[str] = frozenset(),
        ca_file: Path | None = None,
    ) -> None:
        if revision is not None:
            raise SourceError(
                f"{url}: an oci:// source takes no revision; pin a digest in the source instead "
                "(oci://<registry>/<repository>@sha256:<digest>)",
                transient=False,
            )
        self.url = url
        self.revision: str | None = revision
        self.ref = Reference.parse(url)
        self.login = login or (login_for(docker_config, self.ref.registry) if docker_config else None)
        self.plain_http = self.ref.registry in plain_http
        self.ca_file = ca_file

    @classmethod
    def from_env(cls, url: str, revision: str | None, *, plain_http: frozenset[str] = frozenset()) -> OciSource:
        """The sidecar's: credentials and registry settings from spec.credentials.oci's env (the operator
        passes the pool's ``plain_http`` instead, and has no credentials)."""
        raw = os.environ.get(AUTH_ENV)
        config = parse_docker_config(raw, where=f"${AUTH_ENV} (spec.credentials.oci.secretName)") if raw else None
        listed = (h.strip() for h in os.environ.get(PLAIN_HTTP_ENV, "").split(","))
        plain = frozenset(h for h in listed if h) | plain_http
        ca = os.environ.get(CA_FILE_ENV)
        return cls(url, revision, docker_config=config, plain_http=plain, ca_file=Path(ca) if ca else None)

    def describe(self) -> str:
        return self.url  # a reference carries no credentials

    def client(self, limits: Limits, deadline: Deadline) -> RegistryClient:
        return RegistryClient(
            self.ref,
            login=self.login,
            plain_http=self.plain_http,
            ca_file=self.ca_file,
            limits=limits,
            deadline=deadline,
        )

    async def resolve(self, client: RegistryClient) -> tuple[dict[str, Any], str]:
        """The adapter's manifest and the digest that names it (an index's own digest when it is one)."""
        body, media_type, digest = await client.manifest(self.ref.ref)
        doc = _json(body, where=f"{self.describe()}: manifest")
        if media_type in INDEX_TYPES or doc.get("mediaType") in INDEX_TYPES:
            child = pick_manifest(doc, where=self.describe())
            body, _, _ = await client.manifest(child)
            doc = _json(body, where=f"{self.describe()}: manifest {child}")
        return doc, digest

    async def fetch_config(self, *, limits: Limits) -> dict[str, Any]:
        deadline = Deadline(limits.config_timeout_s, f"{self.describe()}: {CONFIG_FILE}")
        with tempfile.TemporaryDirectory(prefix="lorapool-config-") as tmp:
            async with self.client(limits, deadline) as client:
                manifest, _ = await self.resolve(client)
                layers = plan_layers(manifest, where=self.describe())
                titled = [x for x in layers if x.name is not None and x.name.name == CONFIG_FILE]
                if titled:  # an artifact: the config is its own small blob
                    dest = Path(tmp) / CONFIG_FILE
                    what = f"{self.describe()}: {CONFIG_FILE}"
                    await client.blob(titled[0].digest, titled[0].size, dest, limit=limits.max_config_bytes, what=what)
                    return parse_config_bytes(dest.read_bytes(), where=self.describe())
                tree = Path(tmp) / "tree"
                tree.mkdir()
                await self._pull(client, layers, Path(tmp), tree, limits, config_only=True)
            found = sorted(tree.rglob(CONFIG_FILE), key=lambda p: len(p.parts))
            if not found:
                raise AdapterError(f"{self.describe()}: no layer holds {CONFIG_FILE}; add it to the image")
            return parse_config_bytes(found[0].read_bytes(), where=self.describe())

    async def download(self, into: Path, *, limits: Limits) -> Downloaded:
        deadline = Deadline(limits.total_timeout_s, f"{self.describe()}: download")
        tree = into / "tree"
        tree.mkdir()
        async with self.client(limits, deadline) as client:
            manifest, digest = await self.resolve(client)
            layers = plan_layers(manifest, where=self.describe())
            total = await self._pull(client, layers, into, tree, limits)
        return Downloaded(root=tree, bytes=total, resolved_revision=digest)

    async def _pull(
        self,
        client: RegistryClient,
        layers: list[Layer],
        scratch: Path,
        tree: Path,
        limits: Limits,
        *,
        config_only: bool = False,
    ) -> int:
        """Every planned layer, digest-checked while streaming: files into ``tree`` at their titles, tars
        unpacked into it in order. Returns the bytes transferred."""
        total = 0
        for index, layer in enumerate(layers):
            what = f"{self.describe()}: layer {layer.digest}"
            if layer.name is not None:
                if config_only:
                    continue
                dest = tree.joinpath(*layer.name.parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                total += await client.blob(layer.digest, layer.size, dest, limit=limits.max_bytes - total, what=what)
                continue
            blob = scratch / f"layer-{index}"
            total += await client.blob(layer.digest, layer.size, blob, limit=limits.max_bytes - total, what=what)
            await asyncio.to_thread(
                archive.extract,
                blob,
                tree,
                limits=limits,
                where=what,
                kind="tar",
                deadline=client.deadline,
                config_only=config_only,
            )
            blob.unlink()
        return total


def _json(body: bytes, *, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except ValueError:
        raise AdapterError(f"{where}: not JSON; the reference does not name an OCI manifest") from None
    if not isinstance(doc, dict):
        raise AdapterError(f"{where}: not a JSON object; the reference does not name an OCI manifest")
    return doc
