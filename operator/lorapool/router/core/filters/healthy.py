"""Keep backends that answered their last poll and have not failed a request since.

Keeps: ``Backend.up``. Reads: ``up``. An empty result means the whole pool (or all of it not tried
yet) is down: admission refuses with 503.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import FilterPlugin


def healthy(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
    """Backends that are up."""
    return [b for b in backends if b.up]


PLUGIN = FilterPlugin("healthy", lambda _params: healthy, reads=("up",))
