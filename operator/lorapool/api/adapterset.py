"""The desired adapter set: what the operator writes to ConfigMap ``<pool>-adapters`` (key
``adapters.json``, or ``index.json`` naming shards when the set is large) and what every
adapter-sync sidecar reads. Pure data.

It is the only contract between the operator and the sidecar, so it is versioned
(``apiVersion``/``kind``) and strict: unknown fields are refused, not ignored.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lorapool.api.common import ADAPTER_NAME_PATTERN, DNS1123_SUBDOMAIN_PATTERN, SHA256_PATTERN, SOURCE_PATTERN

CONFIGMAP_KEY = "adapters.json"
ADAPTERSET_API_VERSION = "lorapool.io/v1alpha1"


class DesiredAdapter(BaseModel):
    """One adapter the engine should have loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=ADAPTER_NAME_PATTERN, max_length=63)
    source: str = Field(pattern=SOURCE_PATTERN)
    revision: str | None = None
    sha256: str | None = Field(default=None, pattern=SHA256_PATTERN)
    rank: int | None = Field(default=None, ge=1)
    # The replica slots placed to hold it (docs/placement.md); absent: every replica.
    replicas: tuple[int, ...] | None = None

    def placed_on(self, slot: int | None) -> bool:
        """True when the replica in ``slot`` should hold it; a replica with no slot yet holds only what is everywhere."""
        return self.replicas is None or (slot is not None and slot in self.replicas)


class AdapterSet(BaseModel):
    """The whole desired set for one pool; the sidecar converges the engine to it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str = Field(default=ADAPTERSET_API_VERSION, alias="apiVersion")
    kind: str = Field(default="AdapterSet")
    pool: str
    base_model: str = Field(alias="baseModel")
    max_lora_rank: int = Field(alias="maxLoraRank", ge=1)
    adapters: tuple[DesiredAdapter, ...] = ()

    def share(self, slot: int | None) -> AdapterSet:
        """The set one replica converges to: adapters placed everywhere plus those placed on ``slot``."""
        return self.model_copy(update={"adapters": tuple(a for a in self.adapters if a.placed_on(slot))})

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> AdapterSet:
        return cls.model_validate_json(text)


# ---- the sharded set (docs/install.md, "How adapter changes reach the engines") ---------------
#
# A ConfigMap holds at most 1 MiB, so a large set is split across shard ConfigMaps
# ``<pool>-adapters-<i>`` (i < MAX_SHARDS, fixed names so the sidecars' Role never changes), each an
# ``AdapterSet`` of part of the adapters. ``<pool>-adapters`` stays the object a reader opens first:
# its ``index.json`` names each shard with the sha256 of its text, and a small set stays inline in its
# ``adapters.json``. The operator writes the shards before the index, and a reader acts only on a set
# whose every shard matches the index's hash: it never acts on a half-written update.

INDEX_KEY = "index.json"
INDEX_KIND = "AdapterSetIndex"
MAX_SHARDS = 32  # fixed, so the Role's resourceNames list every shard name a pool can ever have
SHARD_BYTES = 512 * 1024  # per object: half the 1 MiB ConfigMap limit, so none nears it


class InconsistentSet(ValueError):
    """The index and the shards do not agree (yet): keep the last consistent set and read again."""


class ShardRef(BaseModel):
    """One shard as the index names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=253)
    sha256: str = Field(pattern=SHA256_PATTERN)  # of the shard's ``adapters.json`` text, as UTF-8
    adapters: int = Field(ge=0)


class AdapterSetIndex(BaseModel):
    """``index.json`` of ``<pool>-adapters``: the set's generation and its shards (none: inline)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: str = Field(default=ADAPTERSET_API_VERSION, alias="apiVersion")
    kind: Literal["AdapterSetIndex"] = "AdapterSetIndex"
    pool: str
    generation: str = Field(pattern=SHA256_PATTERN)  # sha256 of the whole set's text (inline: adapters.json)
    shards: tuple[ShardRef, ...] = Field(default=(), max_length=MAX_SHARDS)

    @model_validator(mode="after")
    def _unique(self) -> AdapterSetIndex:
        if len({s.name for s in self.shards}) != len(self.shards):
            raise ValueError("shards: a shard is named twice; each shard name must appear once")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> AdapterSetIndex:
        return cls.model_validate_json(text)


def content_hash(text: str) -> str:
    """The sha256 the index records for a text (a shard's, or the inline set's)."""
    return hashlib.sha256(text.encode()).hexdigest()


def shard_of(name: str, count: int) -> int:
    """The shard of adapter ``name`` among ``count`` (a power of two): stable while others come and go,
    and when the count doubles an adapter stays put or moves to ``i + count``, never elsewhere."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count


def read_index(data: Mapping[str, str]) -> AdapterSetIndex | None:
    """The index in the data of ``<pool>-adapters``; None for a set written before the index existed
    (its ``adapters.json`` is the whole set). A bad index raises ValueError naming what is wrong."""
    text = data.get(INDEX_KEY)
    if text is None:
        if CONFIGMAP_KEY not in data:
            raise ValueError(
                f"neither {INDEX_KEY} nor {CONFIGMAP_KEY} in the index ConfigMap; the operator writes them"
            )
        return None
    try:
        return AdapterSetIndex.from_json(text)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "document"
        raise ValueError(f"{INDEX_KEY}: {where}: {err.get('msg', 'invalid')}; the operator writes this index") from exc


def assemble(index: AdapterSetIndex | None, data: Mapping[str, str], shards: Mapping[str, str | None]) -> bytes:
    """The whole set as one ``adapters.json`` document, from the index ConfigMap's ``data`` and the text
    of each shard it names (None: not found). Raises InconsistentSet while a shard is missing or does
    not match its hash yet. Entries are not validated here: the reader rejects bad ones one by one."""
    if index is None or not index.shards:
        text = data.get(CONFIGMAP_KEY)
        if text is None:
            raise InconsistentSet(f"the index names no shard and {CONFIGMAP_KEY} is missing")
        if index is not None and content_hash(text) != index.generation:
            raise InconsistentSet(f"inline {CONFIGMAP_KEY} does not match generation {index.generation[:12]}")
        return text.encode()
    header: dict[str, Any] | None = None
    entries: list[Any] = []
    for ref in index.shards:
        text = shards.get(ref.name)
        if text is None:
            raise InconsistentSet(f"shard {ref.name} of generation {index.generation[:12]} is missing")
        if content_hash(text) != ref.sha256:
            raise InconsistentSet(f"shard {ref.name} does not match generation {index.generation[:12]} yet")
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("adapters", []), list):
            raise ValueError(f"shard {ref.name}: not an AdapterSet document; the operator writes it")
        head = {k: v for k, v in doc.items() if k != "adapters"}
        if header is not None and head != header:
            raise ValueError(f"shard {ref.name}: its pool, base model or rank differs from the other shards")
        header = head
        entries.extend(doc.get("adapters", []))
    assert header is not None
    return json.dumps({**header, "adapters": entries}, indent=2).encode() + b"\n"
