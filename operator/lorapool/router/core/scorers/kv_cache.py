"""Prefer the backend with the most free KV cache (vllm:kv_cache_usage_perc).

A replica near a full KV cache preempts running requests, which costs far more than a slightly
longer queue elsewhere. Score: ``1 - kv_usage``, in [0, 1] (1 = empty cache). Reads:
``kv_usage``. Weight 0.5: a tie-breaker after load (see ``lora_affinity`` for the scale).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import ScorerPlugin


def kv_cache(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Free KV-cache fraction per backend."""
    return {b.id: 1.0 - b.kv_usage for b in backends}


PLUGIN = ScorerPlugin("kv-cache", lambda _params: kv_cache, weight=0.5, reads=("kv_usage",))
