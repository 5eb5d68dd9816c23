"""The one registry of router plugins and of the named policies ``--policy`` offers. Pure.

Plugins (each declared by its own module, see ``plugin``):
  filters   healthy, serves-model, bounded-load, lora-slots, saturation
  scorers   lora-affinity, least-load, kv-cache, rendezvous, slot-pressure (weight beside each),
            prefix (opt-in: counted only with --prefix-weight > 0)
  pickers   highest-score, round-robin
  holds     hold-always, hold-if-active (whether a request that fits nowhere waits or goes at once)

Named policies (the names are ``api.common.RouterPolicy``: the CRD's ``spec.router.policy`` enum
and ``--policy`` accept exactly the keys of ``POLICIES``):
  affinity      group requests by adapter on replicas where it is active, bounded load, never
                more distinct adapters in flight than a replica's LoRA slots, nor more requests
                than its --max-inflight (or --max-prefilling) when set (requests that fit nowhere wait in the router
                and bind late); with --prefix-weight, prefix locality among the adapter's replicas
  least-loaded  fewest requests in flight, adapter-blind (baseline)
  round-robin   in turn, adapter-blind (baseline)

Each builds a ``Scheduling``: the strict policy, and the best-effort policy used once a held
request has waited ``max_wait`` (or the strict one again when the policy never holds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lorapool.api.common import RouterPolicy
from lorapool.router.core.filters.bounded_load import PLUGIN as BOUNDED_LOAD
from lorapool.router.core.filters.healthy import PLUGIN as HEALTHY
from lorapool.router.core.filters.lora_slots import PLUGIN as LORA_SLOTS
from lorapool.router.core.filters.saturation import PLUGIN as SATURATION
from lorapool.router.core.filters.serves_model import PLUGIN as SERVES_MODEL
from lorapool.router.core.hold_rules import ALWAYS, IF_ACTIVE
from lorapool.router.core.pickers import HIGHEST_SCORE, ROUND_ROBIN
from lorapool.router.core.plugin import FilterPlugin, HoldPlugin, PickerPlugin, Plugin, PolicyParams, ScorerPlugin
from lorapool.router.core.policy import Policy, Scheduling, Scorer
from lorapool.router.core.scorers.kv_cache import PLUGIN as KV_CACHE
from lorapool.router.core.scorers.least_load import PLUGIN as LEAST_LOAD
from lorapool.router.core.scorers.lora_affinity import PLUGIN as LORA_AFFINITY
from lorapool.router.core.scorers.prefix import PLUGIN as PREFIX
from lorapool.router.core.scorers.rendezvous import PLUGIN as RENDEZVOUS
from lorapool.router.core.scorers.slot_pressure import PLUGIN as SLOT_PRESSURE


@dataclass(frozen=True)
class Profile:
    """One chain of plugins: filters -> weighted scorers -> picker."""

    filters: tuple[FilterPlugin, ...]
    scorers: tuple[ScorerPlugin, ...]
    picker: PickerPlugin

    def build(self, name: str, params: PolicyParams, shared: dict[str, Scorer] | None = None) -> Policy:
        """The policy; a scorer whose weight is 0 with ``params`` (an opt-in one left off) is left out.
        ``shared``: scorers already built for another chain of the same scheduling, by name, reused
        (and filled) so a stateful scorer keeps one state for both chains, each chain counting it
        with its own weight."""
        built = {} if shared is None else shared
        scorers = []
        for s in self.counted(params):
            if s.name not in built:
                built[s.name] = s.factory(params)
            scorers.append((built[s.name], s.weight_in(params)))
        return Policy(
            name, tuple((f.name, f.build(params)) for f in self.filters), tuple(scorers), self.picker.build(params)
        )

    def counted(self, params: PolicyParams) -> tuple[ScorerPlugin, ...]:
        """The scorers a policy built with ``params`` counts (weight > 0)."""
        return tuple(s for s in self.scorers if s.weight_in(params) > 0)

    def describe(self, params: PolicyParams | None = None) -> str:
        """One line, e.g. ``healthy > serves-model | least-load x1 | highest-score``."""
        params = params or PolicyParams()
        counted = self.counted(params)
        scorers = " + ".join(f"{s.name} x{s.weight_in(params):g}" for s in counted) or "no scorer"
        return f"{' > '.join(f.name for f in self.filters)} | {scorers} | {self.picker.name}"


@dataclass(frozen=True)
class NamedPolicy:
    """A ``--policy`` value: its strict profile and, when it may hold requests, its fallback."""

    name: RouterPolicy
    summary: str
    strict: Profile
    # The best-effort profile for requests that waited their limit (or may not wait, by the hold
    # rule); None: the policy never holds.
    fallback: Profile | None = None
    hold: HoldPlugin = ALWAYS

    def build(self, params: PolicyParams) -> Scheduling:
        shared: dict[str, Scorer] = {}  # one instance of each scorer for both chains
        strict = self.strict.build(str(self.name), params, shared)
        if self.fallback is None:
            return Scheduling(strict, strict)
        fallback = self.fallback.build(f"{self.name}-best-effort", params, shared)
        return Scheduling(strict, fallback, hold_plugin(params.hold_rule or self.hold.name).build(params))


def _by_name(plugins: Iterable[Plugin]) -> dict[str, Plugin]:
    index: dict[str, Plugin] = {}
    for plugin in plugins:
        if plugin.name in index:
            raise ValueError(f"two router plugins are named {plugin.name!r}; plugin names are unique")
        index[plugin.name] = plugin
    return index


FILTERS: tuple[FilterPlugin, ...] = (HEALTHY, SERVES_MODEL, BOUNDED_LOAD, LORA_SLOTS, SATURATION)
SCORERS: tuple[ScorerPlugin, ...] = (LORA_AFFINITY, LEAST_LOAD, KV_CACHE, RENDEZVOUS, SLOT_PRESSURE, PREFIX)
PICKERS: tuple[PickerPlugin, ...] = (HIGHEST_SCORE, ROUND_ROBIN)
HOLDS: tuple[HoldPlugin, ...] = (ALWAYS, IF_ACTIVE)
PLUGINS: Mapping[str, Plugin] = _by_name((*FILTERS, *SCORERS, *PICKERS, *HOLDS))

# Prefix last and opt-in (--prefix-weight, 0 by default): off, the policy is exactly the one without it.
_AFFINITY_SCORERS = (LORA_AFFINITY, LEAST_LOAD, RENDEZVOUS, KV_CACHE, PREFIX)

POLICIES: Mapping[RouterPolicy, NamedPolicy] = {
    p.name: p
    for p in (
        NamedPolicy(
            RouterPolicy.AFFINITY,
            "adapter affinity with bounded load and LoRA-slot grouping (holds requests that fit nowhere)",
            # The cap comes before the slot filter so that it is measured against the whole
            # pool: a hot adapter's replica over the cap is not a candidate even when every
            # other replica's slots are taken, so its requests wait and bind where a slot frees
            # (they spread) instead of piling up behind one replica's batch.
            # Saturation last (a no-op without --max-inflight or --max-prefilling): a request that has a slot but finds
            # every replica full waits too (Hold(saturated)), so the router, not the engine, orders it.
            Profile((HEALTHY, SERVES_MODEL, BOUNDED_LOAD, LORA_SLOTS, SATURATION), _AFFINITY_SCORERS, HIGHEST_SCORE),
            # Best effort: same preferences, but among replicas that are all full, the least
            # over-committed one wins before load decides.
            Profile(
                (HEALTHY, SERVES_MODEL, BOUNDED_LOAD),
                (*_AFFINITY_SCORERS, SLOT_PRESSURE),
                HIGHEST_SCORE,
            ),
            # Hold every request that fits nowhere (hold-always, the default). Issue 12 proposed
            # hold-if-active (send an adapter that runs nowhere best-effort at once); measured side
            # by side it cost p99 TTFT in (a) and (b) and did not help (c) (bench/RESULTS.md), so
            # it is a --hold-rule choice, not the default.
        ),
        NamedPolicy(
            RouterPolicy.LEAST_LOADED,
            "fewest requests in flight, adapter-blind (baseline)",
            Profile((HEALTHY, SERVES_MODEL), (LEAST_LOAD,), HIGHEST_SCORE),
        ),
        NamedPolicy(
            RouterPolicy.ROUND_ROBIN,
            "each backend that serves the model in turn, adapter-blind (baseline)",
            Profile((HEALTHY, SERVES_MODEL), (), ROUND_ROBIN),
        ),
    )
}


def hold_plugin(name: str) -> HoldPlugin:
    """The hold rule called ``name``; raises ValueError naming the choices."""
    for plugin in HOLDS:
        if plugin.name == name:
            return plugin
    raise ValueError(f"--hold-rule={name!r} is not one of {', '.join(p.name for p in HOLDS)}")


def names() -> tuple[str, ...]:
    """The ``--policy`` values, in the registry's order."""
    return tuple(str(name) for name in POLICIES)


def lookup(name: str) -> NamedPolicy:
    """The named policy; raises ValueError naming the choices."""
    try:
        return POLICIES[RouterPolicy(name)]
    except (ValueError, KeyError):
        raise ValueError(f"--policy={name!r} is not one of {', '.join(names())}") from None


def build(name: str, params: PolicyParams | None = None) -> Scheduling:
    """The scheduling for a ``--policy`` value; raises ValueError naming the choices."""
    return lookup(name).build(params or PolicyParams())
