"""Hold rules: when no backend may take a request now, does it wait for a slot or go at once? Pure.

``always`` (affinity's rule) holds every such request in its adapter's queue: it binds where a
slot frees first, anywhere in the pool, and the rest of its queue follows as hits. ``if-active``
holds only while the adapter is in flight somewhere and sends one that runs nowhere best-effort
at once (the least over-committed replica), on the idea that waiting groups it with nothing
(issue 12, regime (c)). Measured side by side (bench/RESULTS.md) it did the opposite: a request
sent to a replica whose slots are all taken waits inside the engine behind that replica's
adapters only (vLLM's max-loras rule, where it can starve) instead of for the first slot to
free on any replica. One run of each cell (2026-12-02 20:25): p99 TTFT grew in three of the
four (a)/(b) cells (a-uniform 1.48 vs 0.86 s, b-zipf-poisson 1.52 vs 0.93 s), goodput moved
both ways by a few %, and (c) collapsed (goodput 1.8 vs 12.3 req/s, p99 2.9 vs 0.23 s). It
stays selectable (``--hold-rule hold-if-active``) so the benchmark can keep measuring it.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import HoldPlugin


def always(req: Request, backends: Sequence[Backend]) -> bool:
    """Hold every request that fits nowhere."""
    return True


def if_active(req: Request, backends: Sequence[Backend]) -> bool:
    """Hold only while the adapter is in flight on a live backend (a batch it can join)."""
    return any(b.up and b.runs(req.model) for b in backends)


ALWAYS = HoldPlugin("hold-always", lambda _params: always, reads=())
IF_ACTIVE = HoldPlugin("hold-if-active", lambda _params: if_active, reads=("up", "active", "model"))
