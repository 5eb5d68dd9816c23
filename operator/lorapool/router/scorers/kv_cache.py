"""Prefer the backend with the most free KV cache (vllm:kv_cache_usage_perc).

Score = 1 - kv_usage. A replica near a full KV cache preempts running requests, which
costs far more than a slightly longer queue elsewhere. Reads ``kv_usage``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.router.backend import Backend, Request


def kv_cache(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Free KV-cache fraction per backend."""
    return {b.id: 1.0 - b.kv_usage for b in backends}
