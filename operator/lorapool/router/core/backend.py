"""What a routing policy may read about a request and a backend. Pure.

A ``Backend`` is a read-only view built by ``state.BackendState.view`` for one decision; its
mappings are live views that stay valid for the duration of one ``Policy.choose`` call.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from enum import StrEnum

from lorapool.api.report import ReplicaReport
from lorapool.api.traffic import Priority


@dataclass(frozen=True, slots=True)
class Request:
    """The part of an OpenAI request that routing needs."""

    model: str
    # False for the base model: it runs without a LoRA slot.
    is_adapter: bool = True
    # The adapter's traffic class (api.traffic; the router's --traffic-file says it).
    priority: Priority = Priority.STANDARD
    # The prompt's tokens as the router estimates them, and the body's max_tokens (None: unset):
    # what fair dispatch charges when the request binds (core.fairness).
    prompt_tokens: int = 0
    max_tokens: int | None = None
    # Per-request data of the policy's stateful scorers, by plugin name (``policy.ScorerHooks.prepare``,
    # computed once per request; empty when no scorer keeps any).
    prepared: Mapping[str, object] = field(default_factory=dict, hash=False)
    # Whether the pool's adapter set names the model (None: the router does not read the set): an
    # adapter it names is never "not in the pool" (core.reports.standing).
    in_pool: bool | None = None


@dataclass(frozen=True, slots=True)
class Backend:
    """One vLLM replica as the router sees it at decision time."""

    id: str
    up: bool = True
    # GPU LoRA slots (vLLM --max-loras): the most distinct adapters in one running batch.
    max_loras: int = 1
    # Models the replica serves (/v1/models ids); None until first polled (assume any).
    models: Set[str] | None = None
    # adapter -> requests in flight or running on the replica (router's own plus foreign).
    active: Mapping[str, int] = field(default_factory=dict)
    # Adapters that probably still hold a GPU slot (recently run), so activating them is free.
    warm: Set[str] = frozenset()
    # Adapters that are probably in the replica's CPU LoRA cache (a ~ms load, not a disk load).
    cached: Set[str] = frozenset()
    # Requests in flight on the replica (router's own plus foreign running and waiting).
    load: int = 0
    # Fraction of the KV cache in use, 0..1 (vllm:kv_cache_usage_perc).
    kv_usage: float = 0.0
    # Requests the router lets run on the replica at once (--max-inflight; 0: no cap): above it
    # the replica is saturated and requests wait in the router, where fair dispatch orders them.
    capacity: int = 0
    # Requests bound here that have not streamed their first token yet (the router's own): they
    # wait in the engine's first-come-first-served prefill queue, where nothing reorders them.
    prefilling: int = 0
    # The most of those the router lets wait in the engine (--max-prefilling; 0: no cap).
    prefill_capacity: int = 0
    # The sidecar's usable report on the replica's pod (None: none; ``models`` then comes from
    # /v1/models). Admission reads it to say where an adapter stands (``reports.standing``).
    report: ReplicaReport | None = None

    def slots_used(self) -> int:
        """Distinct adapters in flight: vLLM runs at most ``max_loras`` of them at once."""
        return len(self.active)

    def runs(self, model: str) -> bool:
        """True when ``model`` is in flight here, so one more request needs no new slot."""
        return model in self.active

    def saturated(self) -> bool:
        """True when the replica runs its ``capacity`` of requests, or has its ``prefill_capacity``
        of them still waiting for a first token, already (never without a cap)."""
        return 0 < self.capacity <= self.load or 0 < self.prefill_capacity <= self.prefilling

    def fits(self, req: Request) -> bool:
        """True when the request can run here without exceeding the LoRA slots."""
        return not req.is_adapter or self.runs(req.model) or self.slots_used() < self.max_loras


class DecisionKind(StrEnum):
    """How a routing decision related to the chosen backend's LoRA slots."""

    HIT = "hit"  # the adapter was already in flight on the backend
    FREE_SLOT = "free_slot"  # it was not, and the backend had a free slot
    MISS = "miss"  # it was not and all slots were taken: the replica will queue or thrash
    QUEUED = "queued"  # no backend fitted: the router held the request before binding it


def classify(req: Request, backend: Backend) -> DecisionKind:
    """Name a decision for the decisions metric (before the request is counted in flight)."""
    if not req.is_adapter or backend.runs(req.model):
        return DecisionKind.HIT
    if backend.slots_used() < backend.max_loras:
        return DecisionKind.FREE_SLOT
    return DecisionKind.MISS
