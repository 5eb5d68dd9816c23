"""Keep backends that answered their last poll and have not failed a request since.

Reads ``Backend.up``. An empty result means the whole pool is down: the shell answers 503.
"""

from __future__ import annotations

from collections.abc import Sequence

from lorapool.router.backend import Backend, Request


def healthy(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
    """Backends that are up."""
    return [b for b in backends if b.up]
