"""What a router plugin is: a name, a factory and, for a scorer, its weight. Pure.

As in the Gateway API Inference Extension's endpoint picker, every filter, scorer and picker
is a small module that declares one ``PLUGIN`` (pickers: one per class in ``pickers``; hold
rules: one per function in ``hold_rules``);
``registry`` collects them by name and composes the named policies of ``--policy`` from them.
A plugin also lists the ``Backend``/``Request`` fields it reads, so a test can check that
nothing else changes its answer. A scorer that keeps per-request data or per-backend memory
owns both through the optional hooks of ``policy.ScorerHooks`` (``scorers.prefix`` shows how);
its factory builds one instance per ``Scheduling``, shared by the strict and best-effort chains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lorapool.router.core.policy import Filter, HoldRule, Picker, Scorer

DEFAULT_LOAD_FACTOR = 1.25
DEFAULT_LOAD_SLACK = 2.0


@dataclass(frozen=True)
class PolicyParams:
    """The knobs a plugin factory may read (``RouterSettings`` fills them from flags)."""

    # Bounded-load cap as a multiple of the mean load (--load-factor).
    load_factor: float = DEFAULT_LOAD_FACTOR
    # Requests a backend may run above the mean before a hot adapter spreads (--load-slack).
    load_slack: float = DEFAULT_LOAD_SLACK
    # A hold rule's name instead of the named policy's own (--hold-rule); "" keeps the policy's.
    hold_rule: str = ""
    # The prefix scorer's weight in the affinity policy (--prefix-weight); 0 leaves it out.
    prefix_weight: float = 0.0


@dataclass(frozen=True)
class FilterPlugin:
    """A filter: keeps the backends that may take a request."""

    name: str
    factory: Callable[[PolicyParams], Filter]
    # Backend/Request fields the filter reads (every other field leaves its answer unchanged).
    reads: tuple[str, ...]

    def build(self, params: PolicyParams) -> Filter:
        return self.factory(params)


@dataclass(frozen=True)
class ScorerPlugin:
    """A scorer: rates candidates in [0, 1]; ``weight`` is what its score counts in a policy."""

    name: str
    factory: Callable[[PolicyParams], Scorer]
    weight: float
    reads: tuple[str, ...]
    # An opt-in scorer's weight from the router's flags (0: the policy leaves it out); None: the
    # scorer always counts ``weight``, which for an opt-in scorer is the weight its flag gives alone.
    weight_of: Callable[[PolicyParams], float] | None = None

    def weight_in(self, params: PolicyParams) -> float:
        """The weight the scorer counts in a policy built with ``params``."""
        return self.weight if self.weight_of is None else self.weight_of(params)

    def build(self, params: PolicyParams) -> tuple[Scorer, float]:
        return self.factory(params), self.weight_in(params)


@dataclass(frozen=True)
class PickerPlugin:
    """A picker: turns the weighted scores into one backend id (a fresh instance per policy)."""

    name: str
    factory: Callable[[PolicyParams], Picker]

    def build(self, params: PolicyParams) -> Picker:
        return self.factory(params)


@dataclass(frozen=True)
class HoldPlugin:
    """A hold rule: whether a request no backend may take now waits for a slot or goes at once."""

    name: str
    factory: Callable[[PolicyParams], HoldRule]
    reads: tuple[str, ...]

    def build(self, params: PolicyParams) -> HoldRule:
        return self.factory(params)


Plugin = FilterPlugin | ScorerPlugin | PickerPlugin | HoldPlugin
