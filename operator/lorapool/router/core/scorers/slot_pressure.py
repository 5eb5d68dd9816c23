"""Prefer the backend whose LoRA slots are least over-committed (for best-effort sends).

Once a held request has waited its limit it must go somewhere over the slot limit; sending it
where the fewest extra adapters already wait keeps one replica from collecting every overflow
(each adapter waiting there turns later requests of it into "hits" on a replica that cannot run
them). Score: ``1 / (1 + adapters over the slots if this request is added)``, in (0, 1]: 1.0
when the request fits, 0.5 one over, ... Reads: ``active``, ``max_loras``, ``model``,
``is_adapter``. Weight 2: in the best-effort policy it outweighs load (1), so among replicas
that are all full the least over-committed one wins before load decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import ScorerPlugin


def slot_pressure(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Inverse over-commitment per backend."""
    scores = {}
    for b in backends:
        extra = 0 if b.fits(req) else 1
        over = max(0, b.slots_used() + extra - b.max_loras)
        scores[b.id] = 1.0 / (1.0 + over)
    return scores


PLUGIN = ScorerPlugin(
    "slot-pressure", lambda _params: slot_pressure, weight=2.0, reads=("active", "max_loras", "model", "is_adapter")
)
