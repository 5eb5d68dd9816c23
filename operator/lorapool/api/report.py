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

- under the key ``ver``, the engine's vLLM version as its ``GET /version`` answers (absent when
  not read), which the operator shows in ``status.engineVersions``;
- under the annotation's key ``obs``, the engine's **observations** over the last closed window
  (``Observations``: distinct adapters per batch, slot waits, KV usage, preemptions, per-adapter
  load), read by sizing (``lorapool.plan.sizing``) and placement. They change once per window,
  so they cost one write per window, never one per scrape.

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

from lorapool.api.vllm_versions import version_of

ANNOTATION = "lorapool.io/adapters"
SYNCED_CONDITION = "lorapool.io/adapters-synced"
REPORT_VERSION = 1
ID_CHARS = 16
MESSAGE_CHARS = 300  # a failure's reason, cut: 1,000 adapters must fit the 256 KiB annotation budget
REVISION_CHARS = 80  # a resolved revision: "sha256:" + 64 hex, or a 40-hex commit
MAX_DOCUMENT_BYTES = 192 * 1024  # beyond this, messages and revisions are dropped (phases and ids stay)


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
    # What the held copy's source resolved to when fetched: an oci:// tag's manifest digest, an hf://
    # branch's commit (the adapter's content identity, shown in its status); None: nothing to resolve.
    revision: str | None = None


@dataclass(frozen=True)
class AdapterLoad:
    """One adapter's load on one replica over a window, in seconds of that window.

    ``inflight_s``: how long the engine listed it in vllm:lora_requests_info (vLLM 0.32 and 0.34,
    and the simulator: in the running batch); its share of the window is the adapter's mean
    presence in the batch, the load placement reads.
    ``waiting_s``: how long it was listed waiting and *not* running. vLLM 0.32 and 0.34 list the
    running batch's adapters in both ``running_lora_adapters`` and ``waiting_lora_adapters``
    (tests/engine/test_observations_real.py), so on those engines this is always 0.
    """

    inflight_s: float
    waiting_s: float = 0.0


@dataclass(frozen=True)
class Observations:
    """What one engine saw over one closed window, from its own ``/metrics`` sampled every few seconds.

    Fields (wire key in brackets):

    - ``window_s`` [w], ``end`` [t] (Unix seconds when the window closed), ``samples`` [n];
    - ``max_loras`` [L]: the engine's ``max_lora`` label (its --max-loras), None when it has no LoRA;
    - ``distinct_p50`` / ``distinct_p95`` / ``distinct_max`` [d]: distinct adapters the engine lists
      in vllm:lora_requests_info (latest series) per sample. On vLLM 0.32 and 0.34 (and the
      simulator) that is the running batch (at most ``max_loras`` bar a preempted request's
      adapter: demand beyond the slots does not show); an engine that lists waiting adapters
      would show demand beyond it;
    - ``slot_wait_s`` [sw]: seconds of the window during which requests waited
      (vllm:num_requests_waiting > 0) while every slot was busy (as many adapters listed as
      ``max_loras``) and the KV cache was not full (vllm:kv_cache_usage_perc < ``KV_FREE_BELOW``):
      waits more slots would end;
    - ``kv_wait_s`` [kw]: seconds during which requests waited while the KV cache was full: waits
      more slots would make worse (every slot takes KV cache);
    - ``kv_usage_p50`` / ``kv_usage_p95`` / ``kv_usage_max`` [kv]: vllm:kv_cache_usage_perc (0-1);
    - ``running_p95`` / ``waiting_p95`` [q]: vllm:num_requests_running / _waiting;
    - ``preemptions`` [p]: increase of vllm:num_preemptions_total over the window (KV pressure);
    - ``finished`` [f]: requests finished (stop or length) in the window (vllm:request_success_total):
      ``finished / window_s`` is the replica's goodput;
    - ``ttft_p50_s`` / ``ttft_p99_s`` [tt]: time to first token of the requests that got their first
      token in the window (vllm:time_to_first_token_seconds histogram, interpolated within buckets);
      None when none did;
    - ``adapters`` [a]: ``AdapterLoad`` per adapter seen in flight in the window (others: absent).
    """

    window_s: float
    end: float
    samples: int
    max_loras: int | None
    distinct_p50: float
    distinct_p95: float
    distinct_max: int
    slot_wait_s: float
    kv_wait_s: float
    kv_usage_p50: float
    kv_usage_p95: float
    kv_usage_max: float
    running_p95: float
    waiting_p95: float
    preemptions: int
    finished: int = 0
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    adapters: Mapping[str, AdapterLoad] = field(default_factory=dict)

    @property
    def goodput(self) -> float:
        """Requests finished per second over the window."""
        return self.finished / self.window_s if self.window_s > 0 else 0.0


KV_FREE_BELOW = 0.9  # KV usage below this counts as "KV cache free": vLLM preempts near 1.0


@dataclass(frozen=True)
class ReplicaReport:
    """Everything one sidecar reports about its engine."""

    engine_healthy: bool
    adapters: Mapping[str, AdapterReport] = field(default_factory=dict)
    observations: Observations | None = None
    engine_version: str | None = None  # the engine's GET /version; None: not read (yet) or not a version

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
        if a.revision:
            entry["rev"] = a.revision[:REVISION_CHARS]
        adapters[name] = entry
    doc: dict[str, Any] = {"v": REPORT_VERSION, "engine": "Healthy" if report.engine_healthy else "Unhealthy"}
    doc["adapters"] = adapters
    if report.observations is not None:
        doc["obs"] = _encode_observations(report.observations)
    if report.engine_version is not None:
        doc["ver"] = report.engine_version
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_DOCUMENT_BYTES:
        for entry in adapters.values():
            entry.pop("message", None)
            entry.pop("rev", None)
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
                revision=entry.get("rev") if isinstance(entry.get("rev"), str) else None,
            )
            for name, entry in (doc.get("adapters") or {}).items()
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return ReplicaReport(
        engine_healthy=doc.get("engine") == "Healthy",
        adapters=adapters,
        observations=_decode_observations(doc.get("obs")),
        engine_version=version_of({"version": doc.get("ver")}),
    )


def _r(x: float, digits: int = 2) -> float:
    return round(float(x), digits)


def _encode_observations(o: Observations) -> dict[str, Any]:
    return {
        "w": _r(o.window_s, 1),
        "t": _r(o.end, 0),
        "n": o.samples,
        "L": o.max_loras,
        "d": [_r(o.distinct_p50, 1), _r(o.distinct_p95, 1), o.distinct_max],
        "sw": _r(o.slot_wait_s, 1),
        "kw": _r(o.kv_wait_s, 1),
        "kv": [_r(o.kv_usage_p50, 3), _r(o.kv_usage_p95, 3), _r(o.kv_usage_max, 3)],
        "q": [_r(o.running_p95, 1), _r(o.waiting_p95, 1)],
        "p": o.preemptions,
        "f": o.finished,
        "tt": [
            None if o.ttft_p50_s is None else _r(o.ttft_p50_s, 4),
            None if o.ttft_p99_s is None else _r(o.ttft_p99_s, 4),
        ],
        "a": {name: [_r(a.inflight_s, 1), _r(a.waiting_s, 1)] for name, a in sorted(o.adapters.items())},
    }


def _decode_observations(raw: Any) -> Observations | None:
    """Observations from the ``obs`` key; None when absent or unreadable (reports stay readable)."""
    if not isinstance(raw, dict):
        return None
    try:
        d, kv, q, tt = raw["d"], raw["kv"], raw["q"], raw.get("tt") or [None, None]
        return Observations(
            window_s=float(raw["w"]),
            end=float(raw["t"]),
            samples=int(raw["n"]),
            max_loras=int(raw["L"]) if raw.get("L") is not None else None,
            distinct_p50=float(d[0]),
            distinct_p95=float(d[1]),
            distinct_max=int(d[2]),
            slot_wait_s=float(raw["sw"]),
            kv_wait_s=float(raw["kw"]),
            kv_usage_p50=float(kv[0]),
            kv_usage_p95=float(kv[1]),
            kv_usage_max=float(kv[2]),
            running_p95=float(q[0]),
            waiting_p95=float(q[1]),
            preemptions=int(raw["p"]),
            finished=int(raw.get("f", 0)),
            ttft_p50_s=None if tt[0] is None else float(tt[0]),
            ttft_p99_s=None if tt[1] is None else float(tt[1]),
            adapters={str(name): AdapterLoad(float(v[0]), float(v[1])) for name, v in (raw.get("a") or {}).items()},
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def pod_report(pod: Mapping[str, Any]) -> ReplicaReport | None:
    """The report on a Pod object (as the API server returns it). Readers take it from
    ``lorapool.api.pods.EnginePod.report``: ``engine_pod`` calls this once per Pod read."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return decode(annotations.get(ANNOTATION))
