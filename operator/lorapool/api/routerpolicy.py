"""The router policy document: which plugins route a pool's requests, with which weights and parameters. Pure data.

One model for both ends: the operator renders it from ``spec.router`` into the ConfigMap
``<pool>-router-policy`` (key ``policy.json``), and the router reads it with ``--policy-file`` and
re-reads it live (``router.policyfile``), building its scheduling from it (``router.core.document``).
Like the traffic document (``api.traffic``) it is versioned and strict: unknown fields are refused.

A document says either which named policy to run (``policy``: the registry's ``affinity``,
``least-loaded``, ``round-robin``, the names of ``spec.router.policy``) or spells the chain out
(``profiles``): a ``strict`` profile (filters -> weighted scorers -> picker) and, for a policy that
holds requests that fit nowhere, a ``fallback`` profile those requests go by once they waited their
limit (or may not wait, by the ``hold`` rule). ``weights`` overrides scorers' weights wherever the
chain lists them (``{prefix: 1.5}`` turns on prefix locality); ``parameters`` holds each plugin's own
knobs (``bounded-load``: ``loadFactor``, ``loadSlack``). Beside the chain, ``dispatch`` says how requests
that must wait are ordered and how long they wait (``spec.router.dispatch``), and ``slots`` what the
router assumes of the engines' LoRA slots until they report them (the plan's ``maxLoras``,
``maxCpuLoras``), so neither a dispatch change nor a re-plan restarts a router. Their defaults are the
router flags' defaults: a document without them runs as the router always did.

The plugin names below are the router registry's (``router.core.registry``); they live here, below
the router, because the API and the CRD need them too, and a test holds the two lists equal.

Which routers run which document is published on each router Pod (``ANNOTATION``, ``PolicyState``)
for the operator's ``RouterPolicyAccepted`` condition (docs/router-policy.md).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from lorapool.api.common import RouterPolicy
from lorapool.api.fields import Document

ROUTER_POLICY_API_VERSION = "lorapool.io/v1alpha1"
ROUTER_POLICY_KIND = "RouterPolicy"
ROUTER_POLICY_CONFIGMAP_KEY = "policy.json"
# The router Pod's annotation that says which document it runs and which one it refused last.
ANNOTATION = "lorapool.io/router-policy"
STATE_VERSION = 1
# A refusal's reason is cut to this many characters on the Pod (an annotation, then a condition message).
MAX_REASON = 512
# Largest weight a document may give a scorer (lora-affinity's is 10; 100 as spec.router.prefixWeight's cap).
MAX_WEIGHT = 100.0
# Largest per-replica request cap (dispatch.maxInflight, maxPrefilling), as spec.router.dispatch's.
MAX_PER_REPLICA = 4096
# Longest wait a document may set, seconds (dispatch.maxWaitSeconds, maxQueueWaitSeconds), as
# spec.router.dispatch.maxQueueWaitSeconds's cap.
MAX_WAIT_S = 600.0


class FilterName(StrEnum):
    """The router's filters (``router.core.registry.FILTERS``)."""

    HEALTHY = "healthy"
    SERVES_MODEL = "serves-model"
    BOUNDED_LOAD = "bounded-load"
    LORA_SLOTS = "lora-slots"
    SATURATION = "saturation"


class ScorerName(StrEnum):
    """The router's scorers (``router.core.registry.SCORERS``)."""

    LORA_AFFINITY = "lora-affinity"
    LEAST_LOAD = "least-load"
    KV_CACHE = "kv-cache"
    RENDEZVOUS = "rendezvous"
    SLOT_PRESSURE = "slot-pressure"
    PREFIX = "prefix"


class PickerName(StrEnum):
    """The router's pickers (``router.core.registry.PICKERS``)."""

    HIGHEST_SCORE = "highest-score"
    ROUND_ROBIN = "round-robin"


class HoldName(StrEnum):
    """The router's hold rules (``router.core.registry.HOLDS``)."""

    ALWAYS = "hold-always"
    IF_ACTIVE = "hold-if-active"


def _check_weight(where: str, weight: float) -> float:
    if not (math.isfinite(weight) and 0 <= weight <= MAX_WEIGHT):
        raise ValueError(
            f"{where}: weight {weight:g} must be a finite number in [0, {MAX_WEIGHT:g}] (0 leaves the scorer out)"
        )
    return weight


class WeightedScorer(Document):
    """A scorer and what its score (in [0, 1]) counts in the total."""

    plugin: ScorerName = Field(description="The scorer's name in the router's registry.")
    weight: float = Field(description="What a score of 1 adds to a backend's total; 0 leaves the scorer out.")

    @model_validator(mode="after")
    def _weight(self) -> WeightedScorer:
        _check_weight(f"scorer {self.plugin.value}", self.weight)
        return self


def _unique(what: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} lists {name!r} twice; list each plugin once")
        seen.add(name)


class ProfileSpec(Document):
    """One chain: filters in order -> weighted scorers -> one picker."""

    filters: list[FilterName] = Field(default_factory=list, description="Filters, applied in order.")
    scorers: list[WeightedScorer] = Field(default_factory=list, description="Scorers with their weights.")
    picker: PickerName = Field(default=PickerName.HIGHEST_SCORE, description="Turns the totals into one backend.")

    @model_validator(mode="after")
    def _once_each(self) -> ProfileSpec:
        _unique("filters", [f.value for f in self.filters])
        _unique("scorers", [s.plugin.value for s in self.scorers])
        return self

    def lists(self, scorer: ScorerName) -> bool:
        return any(s.plugin == scorer for s in self.scorers)


class Profiles(Document):
    """The strict chain and, for a policy that holds requests, the best-effort chain after the hold."""

    strict: ProfileSpec = Field(description="Every request goes by it first.")
    fallback: ProfileSpec | None = Field(
        default=None,
        description="Requests that waited their limit (or may not wait, by the hold rule) go by it; "
        "unset: the policy never holds (a request no backend passes gets 503).",
    )


class BoundedLoadParameters(Document):
    """The ``bounded-load`` filter's cap: max(loadFactor x mean, mean + loadSlack) requests per backend."""

    load_factor: float | None = Field(default=None, gt=0, le=100, description="Multiple of the mean load (1.25).")
    load_slack: float | None = Field(default=None, ge=0, le=10000, description="Requests above the mean (2).")


class PluginParameters(Document):
    """Each plugin's own knobs, by plugin name; a plugin not listed runs with its defaults."""

    bounded_load: BoundedLoadParameters | None = Field(default=None, alias="bounded-load")

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            known = [str(f.alias or n) for n, f in cls.model_fields.items()]
            for key in data:
                if key not in known and key not in cls.model_fields:
                    raise ValueError(
                        f"no plugin named {key!r} takes parameters; plugins with parameters: {', '.join(known)}"
                    )
        return data


def _check_cap(value: int) -> int:
    if not 0 <= value <= MAX_PER_REPLICA:
        raise ValueError(
            f"{value} requests per replica is outside [0, {MAX_PER_REPLICA}]; "
            f"give 1 to {MAX_PER_REPLICA}, or 0 (the default) for no cap"
        )
    return value


def _check_wait(value: float, *, zero: bool) -> float:
    low = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and low and value <= MAX_WAIT_S):
        interval = f"[0, {MAX_WAIT_S:g}]" if zero else f"(0, {MAX_WAIT_S:g}]"
        raise ValueError(f"{value:g} s is outside {interval}; give a finite number of seconds in it")
    return value


class DispatchParameters(Document):
    """How requests that must wait are ordered and how long they wait: ``spec.router.dispatch`` and the
    router's ``--fair-dispatch``, ``--max-prefilling``, ``--max-inflight``, ``--max-queue-wait``,
    ``--max-wait`` (docs/traffic.md). Each default is the flag's."""

    fair: bool = Field(
        default=False,
        description="Held requests bind by a virtual token counter per adapter, weighted by priority class "
        "(core.fairness), instead of class then age.",
    )
    max_prefilling: int = Field(
        default=0, description="Requests per replica without a first token; more wait in the router. 0: no cap."
    )
    max_inflight: int = Field(default=0, description="Requests per replica in all; more wait in the router. 0: no cap.")
    max_queue_wait_seconds: float = Field(
        default=30.0,
        description="Longest a request waits because every replica is at its maxInflight or maxPrefilling, "
        "seconds; then it is sent best effort.",
    )
    max_wait_seconds: float = Field(
        default=2.0,
        description="Longest a request waits for a LoRA slot (then best effort) or for its adapter to load "
        "(then 503), seconds.",
    )

    @field_validator("max_prefilling", "max_inflight")
    @classmethod
    def _cap(cls, value: int) -> int:
        return _check_cap(value)

    @field_validator("max_queue_wait_seconds")
    @classmethod
    def _queue_wait(cls, value: float) -> float:
        return _check_wait(value, zero=False)

    @field_validator("max_wait_seconds")
    @classmethod
    def _wait(cls, value: float) -> float:
        return _check_wait(value, zero=True)


class SlotParameters(Document):
    """What the router assumes of each engine's LoRA slots until the engine reports them: the plan's
    ``maxLoras`` and ``maxCpuLoras`` (the router's ``--max-loras``, ``--max-cpu-loras``)."""

    max_loras: int = Field(default=1, description="GPU LoRA slots per replica (vLLM --max-loras; its default 1).")
    max_cpu_loras: int | None = Field(
        default=None,
        description="The replicas' vLLM --max-cpu-loras, to prefer CPU-cached adapters; unset: unknown.",
    )

    @field_validator("max_loras", "max_cpu_loras")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"{value} slots: give at least 1 (vLLM's least)")
        return value

    @model_validator(mode="after")
    def _cpu_holds_gpu(self) -> SlotParameters:
        cpu = self.max_cpu_loras
        if cpu is not None and cpu < self.max_loras:
            raise ValueError(
                f"maxCpuLoras={cpu} is below maxLoras={self.max_loras} (vLLM requires max-cpu-loras >= "
                f"max-loras); give at least {self.max_loras}, or leave it out"
            )
        return self


class RouterPolicyDocument(Document):
    """What ``--policy-file`` holds: the router's scheduling policy, versioned."""

    api_version: Literal["lorapool.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["RouterPolicy"]
    name: str = Field(default="", max_length=63, description="The policy's name in logs; default: policy's or custom.")
    policy: RouterPolicy | None = Field(default=None, description="Run this named policy (or give profiles).")
    profiles: Profiles | None = Field(default=None, description="Spell the chain out (or name a policy).")
    hold: HoldName | None = Field(default=None, description="The hold rule instead of the policy's own.")
    weights: dict[ScorerName, float] = Field(
        default_factory=dict, description="Scorer weights instead of the chain's, wherever the chain lists them."
    )
    parameters: PluginParameters = Field(default_factory=PluginParameters, description="Plugins' parameters.")
    dispatch: DispatchParameters = Field(
        default_factory=DispatchParameters, description="How held requests bind and how long they wait."
    )
    slots: SlotParameters = Field(
        default_factory=SlotParameters, description="The engines' LoRA slots, until the engines report them."
    )

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[ScorerName, float]) -> dict[ScorerName, float]:
        for scorer, weight in value.items():
            _check_weight(f"weights.{scorer.value}", weight)
        return value

    @model_validator(mode="after")
    def _coherent(self) -> RouterPolicyDocument:
        if (self.policy is None) == (self.profiles is None):
            raise ValueError("give either policy (a named policy: affinity, least-loaded, round-robin) or profiles")
        if self.profiles is not None:
            if self.hold is not None and self.profiles.fallback is None:
                raise ValueError(
                    f"hold {self.hold.value} needs profiles.fallback (the chain held requests go by after their "
                    "wait); add a fallback profile or drop hold"
                )
            chains = [p for p in (self.profiles.strict, self.profiles.fallback) if p is not None]
            for scorer in self.weights:
                if not any(p.lists(scorer) for p in chains):
                    raise ValueError(
                        f"weights.{scorer.value}: no profile lists scorer {scorer.value}; "
                        "add it to a profile's scorers with its weight, or drop the weight"
                    )
        return self

    @property
    def label(self) -> str:
        """The name logs and the metric give the policy."""
        return self.name or (self.policy.value if self.policy is not None else "custom")

    def to_json(self) -> str:
        """The ConfigMap's text (and the bytes the router hashes)."""
        return self.model_dump_json(by_alias=True, exclude_none=True, exclude_defaults=True, indent=2) + "\n"

    @property
    def hash(self) -> str:
        """The document's hash as routers export it: of ``to_json()``, so the operator's file hashes the same."""
        return document_hash(self.to_json().encode())

    @classmethod
    def from_json(cls, text: str | bytes) -> RouterPolicyDocument:
        return cls.model_validate_json(text)


def named_document(policy: RouterPolicy, *, weights: Mapping[ScorerName, float] | None = None) -> RouterPolicyDocument:
    """The document that runs a named policy, with scorer weights set (``{PREFIX: 1.5}``)."""
    return RouterPolicyDocument.model_validate(
        {
            "apiVersion": ROUTER_POLICY_API_VERSION,
            "kind": ROUTER_POLICY_KIND,
            "policy": policy,
            "weights": weights or {},
        }
    )


def document_hash(data: bytes) -> str:
    """16 hex digits of the bytes' SHA-256: what a router exports and publishes."""
    return hashlib.sha256(data).hexdigest()[:16]


def problems(exc: ValidationError) -> str:
    """A validation error as one line: each field's path and what is wrong with it."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors())


@dataclass(frozen=True)
class PolicyState:
    """What one router says of its policy document: the hash it runs, and the last edit it refused."""

    running: str  # the hash of the document in force
    source: str = "file"  # "file" (--policy-file) or "flags" (no file: the flags' document)
    refused: str | None = None  # the hash of the last document it refused since the one it runs
    reason: str = ""  # why it refused it (the file and the fields)


def encode_state(state: PolicyState) -> str:
    """The annotation's value (compact JSON)."""
    doc: dict[str, Any] = {"v": STATE_VERSION, "h": state.running, "s": state.source}
    if state.refused is not None:
        doc["r"] = {"h": state.refused, "m": state.reason[:MAX_REASON]}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode_state(text: str | None) -> PolicyState | None:
    """The state in an annotation, or None when absent or unreadable (an older or newer router)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("v") != STATE_VERSION:
            return None
        refused = doc.get("r")
        return PolicyState(
            running=str(doc["h"]),
            source=str(doc.get("s", "file")),
            refused=str(refused["h"]) if isinstance(refused, dict) else None,
            reason=str(refused.get("m", "")) if isinstance(refused, dict) else "",
        )
    except (ValueError, TypeError, KeyError):
        return None


def pod_policy_state(pod: Mapping[str, Any]) -> PolicyState | None:
    """The state on a router Pod object (as the API server returns it)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return decode_state(annotations.get(ANNOTATION))
