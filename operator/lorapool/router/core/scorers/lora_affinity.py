"""Prefer the backend where the adapter costs least to run next.

Score, in [0, 1], one level per case:
  1.0  the adapter is in flight there: it joins the running batch, no slot needed
  0.8  it is warm (probably still in a GPU slot) and a slot is free: activation is free
  0.6  it is probably in the CPU LoRA cache and a slot is free: a CPU->GPU copy (~3-9 ms)
  0.4  a slot is free but the adapter is cold: a disk load (~40-500 ms) stalls the batch
  0.0  no free slot: the request waits inside vLLM behind other adapters
Base-model requests need no slot and score 1.0 everywhere. The levels follow the llm-d
lora-affinity scorer (1.0 active, 0.8 free slot, ...) with the cache levels added.
Reads: ``active``, ``warm``, ``cached``, ``max_loras``, ``model``, ``is_adapter``.

Weight 10: levels are 0.2 apart, and x10 that gap (2.0) outweighs every other scorer of the
affinity policy together (least-load 1 + kv-cache 0.5 + rendezvous 0.3 = 1.8), so affinity
decides and the rest only break ties within a level: load first, then KV pressure, then the
hash that sends a cold adapter home. Spreading a hot adapter is the bounded-load filter's job,
not a score trade-off. The opt-in prefix scorer (``--prefix-weight``, 1.5) stays under one gap on
its own; ``prefix`` says when it and the tie-breakers together may move a request one level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import ScorerPlugin

ACTIVE, WARM, CACHED, COLD, FULL = 1.0, 0.8, 0.6, 0.4, 0.0
LEVELS = (ACTIVE, WARM, CACHED, COLD, FULL)


def affinity_of(req: Request, b: Backend) -> float:
    """The affinity level of one backend for one request."""
    if not req.is_adapter or b.runs(req.model):
        return ACTIVE
    if b.slots_used() >= b.max_loras:
        return FULL
    if req.model in b.warm:
        return WARM
    if req.model in b.cached:
        return CACHED
    return COLD


def lora_affinity(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Affinity level per backend."""
    return {b.id: affinity_of(req, b) for b in backends}


PLUGIN = ScorerPlugin(
    "lora-affinity",
    lambda _params: lora_affinity,
    weight=10.0,
    reads=("active", "warm", "cached", "max_loras", "model", "is_adapter"),
)
