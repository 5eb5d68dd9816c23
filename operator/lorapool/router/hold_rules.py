"""Hold rules: when no backend may take a request now, does it wait for a slot or go at once? Pure.

Holding a request in its adapter's queue pays off when the adapter runs somewhere: once a slot
frees, the request (and its queue after it) joins that adapter's batch, and the wait replaces a
slot change that would stall a whole batch. An adapter that runs on no replica has no batch to
join: wherever it goes it needs a slot change, so holding it only adds the wait (regime (c) of
the benchmark: 2,000 uniformly used adapters, where a fifth of the requests waited in the router
for nothing). ``if-active`` sends such a request at once, best-effort (the least over-committed
replica); ``always`` is the rule the affinity policy had before.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.backend import Backend, Request
from lorapool.router.plugin import HoldPlugin


def always(req: Request, backends: Sequence[Backend]) -> bool:
    """Hold every request that fits nowhere."""
    return True


def if_active(req: Request, backends: Sequence[Backend]) -> bool:
    """Hold only while the adapter is in flight on a live backend (a batch it can join)."""
    return any(b.up and b.runs(req.model) for b in backends)


ALWAYS = HoldPlugin("hold-always", lambda _params: always, reads=())
IF_ACTIVE = HoldPlugin("hold-if-active", lambda _params: if_active, reads=("up", "active", "model"))
