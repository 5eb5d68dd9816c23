"""What an engine holds, as its adapter-sync sidecar reports it on its own Pod. Pure data.

The one channel from the engines back to the control plane (docs/status.md): each sidecar
writes, in one strategic-merge patch of its Pod's ``status`` subresource,

- the annotation ``lorapool.io/adapters``: a compact JSON document, one entry per adapter
  the sidecar knows, with its phase on that replica, the identity of the desired entry it
  works towards (``id``), the identity the engine holds now (``loaded``: ``true`` when it
  is ``id`` itself, absent when none) and, when failed, the engine's or the source's reason
  (``message``). 1,000 loaded adapters take ~70 KB of the 256 KiB annotation budget;
- the pod condition ``lorapool.io/adapters-synced``: True once the first sync since the
  engine (re)started is over (every desired adapter loaded or failed); the engine pod's
  readiness gate, so a pod joins the Service with its adapters, while a broken adapter
  (which fails on every replica alike) keeps no pod out.

The operator aggregates the annotations of Ready engine pods into ``loadedReplicas`` and the
adapters' conditions; the router may read the same annotation to route by state. Identities
are ``adapter_identity(source, revision, sha256)`` cut to ``ID_CHARS``: the operator computes
the same from the spec, so "loaded" always means "loaded at the revision the spec asks for".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ANNOTATION = "lorapool.io/adapters"
SYNCED_CONDITION = "lorapool.io/adapters-synced"
REPORT_VERSION = 1
ID_CHARS = 16
MESSAGE_CHARS = 300  # a failure's reason, cut: 1,000 adapters must fit the 256 KiB annotation budget
MAX_DOCUMENT_BYTES = 192 * 1024  # beyond this, messages are dropped (phases and ids stay)


def adapter_identity(source: str, revision: str | None, sha256: str | None) -> str:
    """What a desired adapter asks for, hashed so that pre-signed URLs never reach disk or the API."""
    return hashlib.sha256(f"{source}\n{revision or ''}\n{sha256 or ''}".encode()).hexdigest()


def short_id(identity: str) -> str:
    return identity[:ID_CHARS]


class ReplicaPhase(StrEnum):
    """An adapter's phase on one replica (the sidecar's own phases)."""

    PENDING = "Pending"
    DOWNLOADING = "Downloading"
    VERIFYING = "Verifying"
    LOADING = "Loading"
    LOADED = "Loaded"
    FAILED = "Failed"
    UNLOADING = "Unloading"


IN_PROGRESS = frozenset({ReplicaPhase.PENDING, ReplicaPhase.DOWNLOADING, ReplicaPhase.VERIFYING, ReplicaPhase.LOADING})


@dataclass(frozen=True)
class AdapterReport:
    """One adapter on one replica."""

    phase: ReplicaPhase
    id: str | None = None  # the desired entry this phase is about (short identity)
    loaded: str | None = None  # what the engine holds now (short identity); None: nothing
    message: str | None = None  # why it failed, in the engine's or the source's words


@dataclass(frozen=True)
class ReplicaReport:
    """Everything one sidecar reports about its engine."""

    engine_healthy: bool
    adapters: Mapping[str, AdapterReport] = field(default_factory=dict)

    def holds(self, name: str, identity: str) -> bool:
        """True when the engine holds ``name`` at ``identity`` (full or short)."""
        entry = self.adapters.get(name)
        return entry is not None and entry.loaded is not None and entry.loaded == short_id(identity)

    def failure(self, name: str, identity: str) -> str | None:
        """The reason ``name`` failed on this replica, when it failed at ``identity``."""
        entry = self.adapters.get(name)
        if entry is None or entry.phase != ReplicaPhase.FAILED or entry.id != short_id(identity):
            return None
        return entry.message or "failed on this replica (no reason given)"

    def loading(self, name: str) -> bool:
        entry = self.adapters.get(name)
        return entry is not None and entry.phase in IN_PROGRESS


def encode(report: ReplicaReport) -> str:
    """The annotation's value: sorted, compact JSON; the same report always gives the same text."""
    adapters: dict[str, dict[str, str | bool]] = {}
    for name in sorted(report.adapters):
        a = report.adapters[name]
        entry: dict[str, str | bool] = {"phase": str(a.phase)}
        if a.id:
            entry["id"] = a.id
        if a.loaded:
            entry["loaded"] = True if a.loaded == a.id else a.loaded  # true: the desired identity itself
        if a.message:
            entry["message"] = a.message[:MESSAGE_CHARS]
        adapters[name] = entry
    doc: dict[str, Any] = {"v": REPORT_VERSION, "engine": "Healthy" if report.engine_healthy else "Unhealthy"}
    doc["adapters"] = adapters
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_DOCUMENT_BYTES:
        for entry in adapters.values():
            entry.pop("message", None)
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    return text


def decode(text: str | None) -> ReplicaReport | None:
    """The report in an annotation, or None when absent or unreadable (a newer or broken writer)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("v") != REPORT_VERSION:
            return None
        adapters = {
            str(name): AdapterReport(
                phase=ReplicaPhase(entry["phase"]),
                id=entry.get("id"),
                loaded=entry.get("id") if entry.get("loaded") is True else entry.get("loaded"),
                message=entry.get("message"),
            )
            for name, entry in (doc.get("adapters") or {}).items()
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return ReplicaReport(engine_healthy=doc.get("engine") == "Healthy", adapters=adapters)


def pod_report(pod: Mapping[str, Any]) -> ReplicaReport | None:
    """The report on a Pod object (as the API server returns it)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return decode(annotations.get(ANNOTATION))
