"""Give each (model, backend) pair a stable pseudo-random score (rendezvous hashing).

As a small-weight tie-breaker it gives every adapter a home replica: when an adapter is cold
everywhere, it goes to the same replica as last time (whose CPU cache may still hold it), and
several router replicas agree on that home without talking to each other. Score: in [0, 1),
from blake2b(model, backend id). Reads: ``id``, ``model``. Weight 0.3: the last tie-breaker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import ScorerPlugin


@lru_cache(maxsize=65536)
def rendezvous_weight(model: str, backend_id: str) -> float:
    """Stable hash of the pair mapped to [0, 1)."""
    digest = hashlib.blake2b(f"{model}\x00{backend_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def rendezvous(req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
    """Hash weight per backend for this model."""
    return {b.id: rendezvous_weight(req.model, b.id) for b in backends}


PLUGIN = ScorerPlugin("rendezvous", lambda _params: rendezvous, weight=0.3, reads=("id", "model"))
