"""Pickers turn weighted scores into one backend id. Pure (their only state is a turn counter).

``HighestScore`` takes the best total and rotates among exact ties, so an idle pool is
shared evenly instead of always hitting the first backend. ``RoundRobin`` ignores scores:
it is the baseline that adapter-aware routing is measured against. Each policy gets a fresh
instance from its plugin's factory, so policies do not share turns.
"""

from __future__ import annotations

from collections.abc import Mapping

from lorapool.router.core.plugin import PickerPlugin

TIE_EPSILON = 1e-9


class HighestScore:
    """Pick the highest total score; rotate among ties."""

    def __init__(self) -> None:
        self._turn = 0

    def __call__(self, scores: Mapping[str, float]) -> str | None:
        if not scores:
            return None
        best = max(scores.values())
        tied = [bid for bid, s in scores.items() if s >= best - TIE_EPSILON]
        if len(tied) == 1:
            return tied[0]
        tied.sort()
        self._turn += 1
        return tied[self._turn % len(tied)]


class RoundRobin:
    """Pick candidates in turn, ignoring scores."""

    def __init__(self) -> None:
        self._turn = -1

    def __call__(self, scores: Mapping[str, float]) -> str | None:
        if not scores:
            return None
        ids = sorted(scores)
        self._turn += 1
        return ids[self._turn % len(ids)]


HIGHEST_SCORE = PickerPlugin("highest-score", lambda _params: HighestScore())
ROUND_ROBIN = PickerPlugin("round-robin", lambda _params: RoundRobin())
