"""Prefer the backend with the fewest requests in flight.

Score: ``1 - load / max(load over candidates)``, in [0, 1]: the idlest candidate scores 1 and
the busiest 0 (all 1 when every candidate is idle). Reads: ``load``. Weight 1: the first
tie-breaker within an affinity level, and the whole of the least-loaded policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import ScorerPlugin


def least_load(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Relative idleness per backend."""
    peak = max((b.load for b in backends), default=0)
    if peak <= 0:
        return {b.id: 1.0 for b in backends}
    return {b.id: 1.0 - b.load / peak for b in backends}


PLUGIN = ScorerPlugin("least-load", lambda _params: least_load, weight=1.0, reads=("load",))
