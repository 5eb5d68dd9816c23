"""A routing policy: filters -> weighted scorers -> one picker. Pure.

Filters drop backends that must not take the request; scorers rate the survivors in [0, 1]
and carry a weight; the picker turns the weighted sums into one backend id. ``filter`` says
which filter left nothing (by its plugin name), so ``admission`` can answer why (503, 404, a
hold for a slot or a load) without running the filters again.

A scorer that needs per-request data or per-backend memory owns both through ``ScorerHooks``
(as the GIE endpoint picker's plugins do): ``prepare`` computes its data once per request (kept in
``Request.prepared`` under the scorer's name), ``on_bind``/``on_release`` see every request bind to
and leave a backend, ``on_backend_reset`` says a backend left or went down. ``Scheduling`` calls
them for every hooked scorer of its chains, once per instance; the scheduler calls ``Scheduling``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from lorapool.router.core.backend import Backend, Request

Filter = Callable[[Request, Sequence[Backend]], Sequence[Backend]]
Scorer = Callable[[Request, Sequence[Backend]], Mapping[str, float]]  # backend id -> [0, 1]
Picker = Callable[[Mapping[str, float]], str | None]
# Given a request no backend may take now and every backend's view: True to hold it in its
# adapter's queue until a slot frees, False to send it best-effort at once.
HoldRule = Callable[[Request, Sequence[Backend]], bool]


class ScorerHooks:
    """A stateful scorer's optional hooks (each a no-op here); a subclass is also the ``Scorer``
    (``__call__``) and holds its per-backend state keyed by backend id, created on demand."""

    name = ""  # the plugin's name: the key of its data in ``Request.prepared``

    def __call__(self, req: Request, backends: Sequence[Backend]) -> Mapping[str, float]:
        raise NotImplementedError

    def prepare(self, req: Request, prompt: str) -> object | None:
        """The scorer's data for ``req`` (whose prompt text is ``prompt``), computed once per
        request before any decision; None: nothing to keep."""
        return None

    def on_bind(self, req: Request, backend: str) -> None:
        """``req`` was bound to (or moved to) ``backend``."""

    def on_release(self, req: Request, backend: str) -> None:
        """``req``, bound to ``backend``, is over (done, failed, cancelled or moved)."""

    def on_backend_reset(self, backend: str) -> None:
        """``backend`` left the pool or went down: forget what is kept for it."""


@dataclass(frozen=True)
class Policy:
    """A named composition of plugins; ``registry`` builds the ones the router ships."""

    name: str
    filters: tuple[tuple[str, Filter], ...]  # (plugin name, filter), applied in order
    scorers: tuple[tuple[Scorer, float], ...]
    picker: Picker

    def filter(self, req: Request, backends: Sequence[Backend]) -> tuple[Sequence[Backend], str]:
        """The backends that survive every filter, and the name of the filter that left none
        ("" when some survive)."""
        for name, keep in self.filters:
            backends = keep(req, backends)
            if not backends:
                return (), name
        return backends, ""

    def scores(self, req: Request, backends: Sequence[Backend]) -> dict[str, float]:
        """Weighted score per surviving backend; each scorer's output is clamped to [0, 1]."""
        total = {b.id: 0.0 for b in backends}
        for score, weight in self.scorers:
            for bid, s in score(req, backends).items():
                if bid in total:
                    total[bid] += weight * min(max(s, 0.0), 1.0)
        return total

    def pick(self, req: Request, survivors: Sequence[Backend]) -> str | None:
        """The id of the best of ``survivors`` (the output of ``filter``); None when there are none."""
        return self.picker(self.scores(req, survivors)) if survivors else None

    def choose(self, req: Request, backends: Sequence[Backend]) -> str | None:
        """The id of the backend to send ``req`` to, or None when no backend may take it."""
        return self.pick(req, self.filter(req, backends)[0])


@dataclass(frozen=True)
class Scheduling:
    """A strict policy plus the fallback used when a request may not (or no longer) wait."""

    strict: Policy
    fallback: Policy
    # When the strict policy leaves no backend for a live pool that serves the model: whether
    # the request waits (None: the policy never holds, the request gets 503).
    hold: HoldRule | None = None

    @property
    def holds(self) -> bool:
        """True when the policy may hold requests."""
        return self.hold is not None

    @cached_property
    def hooked(self) -> tuple[ScorerHooks, ...]:
        """The scorers with hooks in either chain, each instance once."""
        found: dict[int, ScorerHooks] = {}
        for policy in (self.strict, self.fallback):
            for score, _ in policy.scorers:
                if isinstance(score, ScorerHooks):
                    found.setdefault(id(score), score)
        return tuple(found.values())

    def prepare(self, req: Request, prompt: str) -> Request:
        """``req`` with every hooked scorer's data for it (``req`` itself when none keeps any)."""
        prepared = {h.name: data for h in self.hooked if (data := h.prepare(req, prompt)) is not None}
        return dataclasses.replace(req, prepared=prepared) if prepared else req

    def bound(self, req: Request, backend: str) -> None:
        for hooks in self.hooked:
            hooks.on_bind(req, backend)

    def released(self, req: Request, backend: str) -> None:
        for hooks in self.hooked:
            hooks.on_release(req, backend)

    def reset(self, backend: str) -> None:
        for hooks in self.hooked:
            hooks.on_backend_reset(backend)
