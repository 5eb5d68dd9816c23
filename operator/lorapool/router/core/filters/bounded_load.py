"""Drop backends whose load would exceed ``factor`` x the mean (consistent hashing with bounded loads).

Affinity alone piles a hot adapter onto the one replica where it is active. Capping each
backend at ``ceil(max(factor * mean, mean + slack))`` requests (mean = in-flight requests over
the candidates, counting the new one, per candidate) makes the overflow go to the next-best
backend, so a hot adapter spreads over as many replicas as its traffic needs (Mirrokni et al.,
2018; KubeAI's PrefixHash uses the same 125 % cap). ``slack`` keeps small absolute gaps from
counting: a decode step costs about the same for 1 or 8 sequences (Punica: 11 ms vs 13 ms at
32), while spreading an adapter costs a LoRA slot that another adapter may be waiting for.

Keeps: backends whose load plus this request stays within the cap; all of them when every
candidate is at the cap (then the cap is not what decides), so it never empties the set.
Reads: ``load``. Parameters: ``--load-factor`` (default 1.25), ``--load-slack`` (default 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.plugin import FilterPlugin, PolicyParams
from lorapool.router.core.policy import Filter

DEFAULT_FACTOR = 1.25
DEFAULT_SLACK = 0.0


def bounded_load(factor: float = DEFAULT_FACTOR, slack: float = DEFAULT_SLACK) -> Filter:
    """A filter that keeps backends whose load plus this request stays within the cap."""
    if factor < 1.0:
        raise ValueError(f"bounded_load factor={factor} must be >= 1 (1.25 is the usual cap)")
    if slack < 0:
        raise ValueError(f"bounded_load slack={slack} must be >= 0 requests")

    def keep_within_cap(req: Request, backends: Sequence[Backend]) -> Sequence[Backend]:
        if len(backends) < 2:
            return backends
        mean = (sum(b.load for b in backends) + 1) / len(backends)
        cap = math.ceil(max(factor * mean, mean + slack))
        within = [b for b in backends if b.load + 1 <= cap]
        return within or backends

    keep_within_cap.__name__ = f"bounded_load({factor:g}, {slack:g})"
    return keep_within_cap


def factory(params: PolicyParams) -> Filter:
    """The filter with the router's --load-factor and --load-slack."""
    return bounded_load(params.load_factor, params.load_slack)


PLUGIN = FilterPlugin("bounded-load", factory, reads=("load",))
