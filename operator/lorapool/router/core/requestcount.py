"""Counts the router's requests per adapter over fixed windows (``api.requests.RequestWindow``). Pure.

Placement sizes each adapter's k from its share of the traffic, and only the router sees every
request, so each router replica counts them here, once per client request at admission (never
per retry), and publishes the last closed window (``GET /lorapool/requests``, and the annotation
``lorapool.io/requests`` on its own Pod). The caller passes the clocks: ``now_s`` (monotonic)
times the windows, ``wall_s`` (Unix seconds, read at the same moment) dates their ends.

Memory is bounded whatever clients send: base-model requests are not counted, a name no
backend knows as an adapter (a typo, random names) is only summed in ``other``, and at most
``max_adapters`` distinct adapters are counted by name per window (first come), the rest summed
in ``other``. The default keeps 5x what is published (``encode`` names the ``MAX_ADAPTERS``
busiest), so a hot adapter first seen late in a window with a long tail is still named: ~1 MB.
"""

from __future__ import annotations

import math

from lorapool.api.requests import MAX_ADAPTERS, RequestWindow

MAX_COUNTED = 5 * MAX_ADAPTERS  # adapters counted by name per window


class RequestCounter:
    """The open window's counts and the last closed window; windows are ``window_s`` apart from ``start_s``."""

    def __init__(self, window_s: float, start_s: float, *, max_adapters: int = MAX_COUNTED) -> None:
        if not (window_s > 0 and math.isfinite(window_s)):
            raise ValueError(f"--requests-window-s must be > 0 seconds (and finite), got {window_s:g}")
        if max_adapters < 0:
            raise ValueError(f"max_adapters must be >= 0, got {max_adapters}")
        self.window_s = float(window_s)
        self.max_adapters = max_adapters
        self.closes_at_s = start_s + self.window_s  # monotonic end of the open window
        self.last: RequestWindow | None = None  # the last closed window
        self._counts: dict[str, int] = {}
        self._other = 0

    def count(self, model: str, *, is_adapter: bool, known: bool, now_s: float, wall_s: float) -> None:
        """One client request for ``model`` (``is_adapter``: not a base model; ``known``: a backend knows it)."""
        self.roll(now_s, wall_s)
        if not is_adapter:
            return
        if known and (model in self._counts or len(self._counts) < self.max_adapters):
            self._counts[model] = self._counts.get(model, 0) + 1
        else:
            self._other += 1

    def roll(self, now_s: float, wall_s: float) -> RequestWindow | None:
        """Close the windows that ended by ``now_s``; returns the newest one closed now, else None.

        Windows that passed without a call closed empty: after an idle spell, ``last`` is the
        empty window that ended last, not the busy one before it."""
        if now_s < self.closes_at_s:
            return None
        passed = int((now_s - self.closes_at_s) // self.window_s)  # whole windows after the open one
        if passed == 0:
            counts, other = self._counts, self._other
        else:
            counts, other = {}, 0
        end_s = self.closes_at_s + passed * self.window_s
        self.last = RequestWindow(self.window_s, end=wall_s - (now_s - end_s), counts=counts, other=other)
        self.closes_at_s = end_s + self.window_s
        self._counts, self._other = {}, 0
        return self.last
