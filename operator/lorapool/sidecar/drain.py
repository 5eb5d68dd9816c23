"""Draining: an adapter placement moved to other replicas stays loaded here a while. Pure.

When a new config moves an adapter out of this replica's share (docs/placement.md), it is
kept loaded, and reported, so routable, for ``drain_s`` while its new holders load it; then
it is unloaded. ``Draining`` maps each such adapter to the time it may go; the shell keeps the
value, passes its names to ``core.diff`` as held, and wakes when the first one is due.
"""

from __future__ import annotations

from collections.abc import Mapping

from lorapool.api.adapterset import AdapterSet

Draining = Mapping[str, float]  # adapter -> when it may be unloaded (the clock's seconds)


def moved_away(before: AdapterSet | None, share: AdapterSet, listed: AdapterSet) -> set[str]:
    """Adapters this replica held in its last share that placement now gives to other replicas only
    (still in the pool, no longer in the share): drained before they are unloaded. A removed adapter
    is not moved: it goes at once, as before placement."""
    if before is None:
        return set()
    kept = {a.name for a in share.adapters}
    pool = {a.name for a in listed.adapters}
    return {a.name for a in before.adapters if a.name not in kept and a.name in pool}


def drain_after_config(
    draining: Draining, before: AdapterSet | None, share: AdapterSet, listed: AdapterSet, *, now: float, drain_s: float
) -> dict[str, float]:
    """The draining set once a new config gives this replica ``share`` of the pool's ``listed`` adapters.

    Adapters back in the share stop draining; those that just moved away start, due ``drain_s``
    from ``now``; one already draining keeps its time (a second move does not extend it).
    """
    kept = {a.name for a in share.adapters}
    after = {n: t for n, t in draining.items() if n not in kept}
    after |= {n: now + drain_s for n in moved_away(before, share, listed) if n not in after}
    return after


def still_draining(draining: Draining, now: float) -> dict[str, float]:
    """The adapters whose drain time is not up at ``now`` (the others may be unloaded)."""
    return {n: t for n, t in draining.items() if t > now}
