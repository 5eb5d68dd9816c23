"""Keep backends below their caps (``--max-inflight``, ``--max-prefilling``): the saturation hold.

A request sent to an engine that is already full waits inside it, first come first served,
whoever sent it: one adapter's flood then sits in front of everybody else's requests and no
router decision can reorder them any more. With a cap, a request that finds every replica full
waits in the router instead (``Hold(saturated)``), where the wait queues, ordered by fair
dispatch's counters (``core.fairness``) or by class and age, decide who goes next when a request
ends. The cap is a request count, exact and immediate (the router's own books plus the foreign
load of the last scrape), not the engines' polled queue depth, which is up to a poll old.
The prefill cap counts the router's own requests that have not streamed a first token: they
wait in the engine's first-come prefill queue, the one place a flood delays everybody (decode
batches grow almost for free), so capping it keeps that queue in the router without capping
the batch.

Keeps: backends below their caps; every backend without one (0, the default).
Reads: ``capacity``, ``load``, ``prefill_capacity``, ``prefilling``. An empty result holds the request; after ``--max-wait`` it is sent
best effort (the fallback policy has no cap), so a cap never loses a request.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import FilterPlugin


def below_capacity(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
    """Backends that may take one more request."""
    return [b for b in backends if not b.saturated()]


PLUGIN = FilterPlugin(
    "saturation", lambda _params: below_capacity, reads=("capacity", "load", "prefill_capacity", "prefilling")
)
