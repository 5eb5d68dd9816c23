"""Packaging a PEFT directory as an ORAS-style OCI artifact, and pushing it (``lorapool adapter push``).

The artifact (an OCI 1.1 image manifest, what ``oras push`` writes, readable by ``oras pull``):

* ``artifactType`` ``application/vnd.lorapool.adapter.v1``, so registries and tools can tell adapters
  from images; the config is the OCI empty descriptor (``{}``), as OCI 1.1 asks of artifacts;
* one layer per kept file (``layout.KEPT_FILES``), ``adapter_config.json`` first, the others sorted,
  each annotated ``org.opencontainers.image.title`` with its file name, of media type
  ``...adapter.config.v1+json`` (the config), ``...adapter.weights.v1.safetensors`` /
  ``...adapter.weights.v1.pytorch`` (the weights) or ``...adapter.file.v1`` (tokenizer files);
* no timestamp annotation: the same files always make the same manifest, so the same digest, and
  pushing an unchanged adapter again is a no-op that prints the digest already deployed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from lorapool.sources.base import Deadline, Limits, sha256_file
from lorapool.sources.layout import BIN_FILE, CONFIG_FILE, SAFETENSORS_FILE
from lorapool.sources.oci import TITLE
from lorapool.sources.oci_client import MANIFEST_TYPES, Login, Reference, RegistryClient

ARTIFACT_TYPE = "application/vnd.lorapool.adapter.v1"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
MEDIA_TYPES = {
    CONFIG_FILE: "application/vnd.lorapool.adapter.config.v1+json",
    SAFETENSORS_FILE: "application/vnd.lorapool.adapter.weights.v1.safetensors",
    BIN_FILE: "application/vnd.lorapool.adapter.weights.v1.pytorch",
}
FILE_TYPE = "application/vnd.lorapool.adapter.file.v1"
MANIFEST_TYPE = MANIFEST_TYPES[0]


@dataclass(frozen=True)
class Blob:
    name: str
    path: Path
    digest: str
    size: int


def describe_files(files: dict[str, Path]) -> list[Blob]:
    """The layers of ``files`` (name -> path), config first, the rest by name; hashes the files."""
    order = sorted(files, key=lambda n: (n != CONFIG_FILE, n))
    return [Blob(n, files[n], f"sha256:{sha256_file(files[n])}", files[n].stat().st_size) for n in order]


def pack_manifest(blobs: list[Blob]) -> bytes:
    """The artifact's manifest bytes (compact JSON, keys in a fixed order). Pure."""
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": EMPTY_TYPE,
            "digest": f"sha256:{hashlib.sha256(EMPTY).hexdigest()}",
            "size": len(EMPTY),
        },
        "layers": [
            {
                "mediaType": MEDIA_TYPES.get(b.name, FILE_TYPE),
                "digest": b.digest,
                "size": b.size,
                "annotations": {TITLE: b.name},
            }
            for b in blobs
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


async def push_adapter(
    files: dict[str, Path],
    ref: Reference,
    *,
    login: Login | None,
    plain_http: bool,
    ca_file: Path | None,
    limits: Limits | None = None,
) -> str:
    """Push the files as an artifact tagged ``ref.tag``; return the manifest's digest."""
    limits = limits or Limits()
    blobs = describe_files(files)
    manifest = pack_manifest(blobs)
    deadline = Deadline(limits.total_timeout_s, f"{ref}: push")
    client = RegistryClient(ref, login=login, plain_http=plain_http, ca_file=ca_file, limits=limits, deadline=deadline)
    async with client:
        await client.push_blob(EMPTY, f"sha256:{hashlib.sha256(EMPTY).hexdigest()}", len(EMPTY))
        for blob in blobs:
            await client.push_blob(blob.path, blob.digest, blob.size)
        await client.push_manifest(manifest, MANIFEST_TYPE, ref.tag or "")
    return f"sha256:{hashlib.sha256(manifest).hexdigest()}"
