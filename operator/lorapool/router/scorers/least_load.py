"""Prefer the backend with the fewest requests in flight.

Score = 1 - load / max(load over candidates), so the idlest candidate scores 1 and the
busiest 0 (all 1 when every candidate is idle). Reads ``load``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.router.backend import Backend, Request


def least_load(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Relative idleness per backend."""
    peak = max((b.load for b in backends), default=0)
    if peak <= 0:
        return {b.id: 1.0 for b in backends}
    return {b.id: 1.0 - b.load / peak for b in backends}
