"""Drop backends whose load would exceed ``factor`` x the mean (consistent hashing with bounded loads).

Affinity alone piles a hot adapter onto the one replica where it is active. Capping each
backend at ``ceil(factor * (total + 1) / n)`` requests (total = in-flight requests over the
candidates, counting the new one) makes the overflow go to the next-best backend, so a hot
adapter spreads over as many replicas as its traffic needs (Mirrokni et al., 2018; KubeAI's
PrefixHash uses the same 125 % cap). Reads ``load``.

This filter never empties the set: when every candidate is at the cap, the cap is not what
decides and all are kept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lorapool.router.backend import Backend, Request
from lorapool.router.policy import Filter

DEFAULT_FACTOR = 1.25


def bounded_load(factor: float = DEFAULT_FACTOR) -> Filter:
    """A filter that keeps backends whose load plus this request stays within the cap."""
    if factor < 1.0:
        raise ValueError(f"bounded_load factor={factor} must be >= 1 (1.25 is the usual cap)")

    def keep_within_cap(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
        if len(backends) < 2:
            return backends
        total = sum(b.load for b in backends) + 1
        cap = math.ceil(factor * total / len(backends))
        within = [b for b in backends if b.load + 1 <= cap]
        return within or backends

    keep_within_cap.__name__ = f"bounded_load({factor:g})"
    return keep_within_cap
