"""A router policy document (``api.routerpolicy``) -> the router's ``Scheduling``. Pure.

Called by ``router.policyfile`` (the mounted document, re-read live) and by ``router.server`` (no
document: the flags' one), through the registry's public names only (``PLUGINS``, ``lookup``,
``hold_plugin``, ``Profile``, ``PolicyParams``), so a document runs exactly the plugins ``--policy``
runs. A named policy (``policy: affinity``) builds the registry's ``NamedPolicy`` with the document's
weights and parameters; ``profiles`` build the same ``Profile`` values from plugin names. A scorer
weight from the document replaces the plugin's own (an opt-in scorer's ``weight_of`` included): a
weight of 0 leaves it out, as the registry does. ``profiles_document`` writes a named policy out as
profiles, which is how the tests show that every named policy is a document that decides the same.

``Overrides`` are the router flags given explicitly beside ``--policy-file``: each replaces the
document's matching knob (``--policy`` the chain, ``--prefix-weight`` the prefix scorer's weight,
``--hold-rule`` the hold rule, ``--load-factor``/``--load-slack`` bounded-load's parameters, the
dispatch flags ``dispatch``'s fields, ``--max-loras``/``--max-cpu-loras`` ``slots``'). Without a
file, the flags' document is ``apply(EMPTY, overrides)`` (``flags_document``). ``knobs`` reads
what the scheduler takes besides the chain (dispatch and slots) into one ``SchedulerKnobs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from lorapool.api.common import RouterPolicy
from lorapool.api.routerpolicy import (
    ROUTER_POLICY_API_VERSION,
    ROUTER_POLICY_KIND,
    FilterName,
    HoldName,
    ProfileSpec,
    RouterPolicyDocument,
    ScorerName,
    named_document,
    problems,
)
from lorapool.router.core import registry
from lorapool.router.core.plugin import FilterPlugin, HoldPlugin, PickerPlugin, PolicyParams, ScorerPlugin
from lorapool.router.core.policy import Scheduling, Scorer
from lorapool.router.core.registry import Profile


@dataclass(frozen=True)
class Overrides:
    """Router flags given on the command line; None: not given, the document's value stands."""

    policy: str | None = None  # --policy
    load_factor: float | None = None  # --load-factor
    load_slack: float | None = None  # --load-slack
    hold_rule: str | None = None  # --hold-rule
    prefix_weight: float | None = None  # --prefix-weight
    fair_dispatch: bool | None = None  # --fair-dispatch
    max_prefilling: int | None = None  # --max-prefilling
    max_inflight: int | None = None  # --max-inflight
    max_queue_wait: float | None = None  # --max-queue-wait
    max_wait: float | None = None  # --max-wait
    max_loras: int | None = None  # --max-loras
    max_cpu_loras: int | None = None  # --max-cpu-loras

    @property
    def given(self) -> tuple[str, ...]:
        """The flags given, as ``--name`` (logs, the running document's description)."""
        return tuple(f"--{k.replace('_', '-')}" for k, v in self.__dict__.items() if v is not None)


# The flags that replace a field of the document's dispatch and slots sections: section -> flag -> field.
_SECTIONS = {
    "dispatch": {
        "fair_dispatch": "fair",
        "max_prefilling": "maxPrefilling",
        "max_inflight": "maxInflight",
        "max_queue_wait": "maxQueueWaitSeconds",
        "max_wait": "maxWaitSeconds",
    },
    "slots": {"max_loras": "maxLoras", "max_cpu_loras": "maxCpuLoras"},
}


def apply(doc: RouterPolicyDocument, o: Overrides) -> RouterPolicyDocument:
    """``doc`` with the flags' values in place of its own; raises ValueError naming the flag and the fix."""
    data: dict[str, Any] = doc.model_dump(mode="json", by_alias=True, exclude_none=True)
    if o.policy is not None:
        data.pop("profiles", None)
        data.pop("name", None)
        data["policy"] = o.policy
    if o.hold_rule is not None:
        data["hold"] = o.hold_rule
    if o.prefix_weight is not None:
        data["weights"] = {**data.get("weights", {}), ScorerName.PREFIX.value: o.prefix_weight}
    if o.load_factor is not None or o.load_slack is not None:
        bounded = dict(data.get("parameters", {}).get(FilterName.BOUNDED_LOAD.value, {}))
        if o.load_factor is not None:
            bounded["loadFactor"] = o.load_factor
        if o.load_slack is not None:
            bounded["loadSlack"] = o.load_slack
        data["parameters"] = {**data.get("parameters", {}), FilterName.BOUNDED_LOAD.value: bounded}
    for section, fields in _SECTIONS.items():
        given = {key: getattr(o, flag) for flag, key in fields.items() if getattr(o, flag) is not None}
        if given:
            data[section] = {**data.get(section, {}), **given}
    try:
        return RouterPolicyDocument.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"{', '.join(o.given)} over the policy document: {problems(exc)}") from None


EMPTY = named_document(RouterPolicy.AFFINITY)


def flags_document(o: Overrides) -> RouterPolicyDocument:
    """The document the flags alone describe (no ``--policy-file``): affinity unless ``--policy`` says."""
    return apply(EMPTY, o)


def params(doc: RouterPolicyDocument) -> PolicyParams:
    """The knobs the plugin factories read, from the document's parameters (defaults where unset)."""
    defaults = PolicyParams()
    bounded = doc.parameters.bounded_load
    return PolicyParams(
        load_factor=defaults.load_factor if bounded is None or bounded.load_factor is None else bounded.load_factor,
        load_slack=defaults.load_slack if bounded is None or bounded.load_slack is None else bounded.load_slack,
        hold_rule=doc.hold.value if doc.hold is not None else "",
        prefix_weight=doc.weights.get(ScorerName.PREFIX, 0.0),
    )


@dataclass(frozen=True)
class SchedulerKnobs:
    """What the scheduler takes from the document besides the chain (``Scheduler.set_policy``): how
    held requests bind and wait (``dispatch``) and the engines' slots until they report them (``slots``)."""

    fair: bool  # fair dispatch (core.fairness) instead of class then age
    max_prefilling: int  # requests per backend before their first token; 0: no cap
    max_inflight: int  # requests per backend; 0: no cap
    max_queue_wait_s: float  # longest a saturated hold waits, seconds
    max_wait_s: float  # longest a slot or load hold waits, seconds
    max_loras: int  # GPU LoRA slots assumed until a backend reports its own
    max_cpu_loras: int | None  # the engines' --max-cpu-loras; None: unknown


def knobs(doc: RouterPolicyDocument) -> SchedulerKnobs:
    """The document's dispatch and slots (their defaults where unset: the router flags' defaults)."""
    d, s = doc.dispatch, doc.slots
    return SchedulerKnobs(
        fair=d.fair,
        max_prefilling=d.max_prefilling,
        max_inflight=d.max_inflight,
        max_queue_wait_s=d.max_queue_wait_seconds,
        max_wait_s=d.max_wait_seconds,
        max_loras=s.max_loras,
        max_cpu_loras=s.max_cpu_loras,
    )


def _plugin(name: str, kind: type[Any], what: str) -> Any:
    plugin = registry.PLUGINS.get(name)
    if not isinstance(plugin, kind):
        known = ", ".join(p.name for p in registry.PLUGINS.values() if isinstance(p, kind))
        raise ValueError(f"this router has no {what} named {name!r}; its {what}s: {known}")
    return plugin


def _weighted(plugin: ScorerPlugin, weight: float) -> ScorerPlugin:
    """The scorer counting ``weight`` (whatever its own weight or opt-in rule)."""
    return replace(plugin, weight=weight, weight_of=None)


def _profile(spec: ProfileSpec) -> Profile:
    filters: tuple[FilterPlugin, ...] = tuple(_plugin(f.value, FilterPlugin, "filter") for f in spec.filters)
    scorers = tuple(_weighted(_plugin(s.plugin.value, ScorerPlugin, "scorer"), s.weight) for s in spec.scorers)
    picker: PickerPlugin = _plugin(spec.picker.value, PickerPlugin, "picker")
    return Profile(filters, scorers, picker)


def _reweighted(profile: Profile, weights: Mapping[ScorerName, float], p: PolicyParams) -> Profile:
    """``profile`` with the document's weights; every scorer's weight made explicit for ``p``."""
    scorers = tuple(_weighted(s, weights.get(s.name, s.weight_in(p))) for s in profile.scorers)  # type: ignore[call-overload]
    return replace(profile, scorers=scorers)


@dataclass(frozen=True)
class Chain:
    """What a document resolves to before building: the profiles and the hold rule, weights explicit."""

    name: str
    strict: Profile
    fallback: Profile | None
    hold: HoldPlugin
    params: PolicyParams

    @property
    def prefix_weight(self) -> float:
        """The prefix scorer's weight in the strict profile (0: off); the scheduler hashes prompts when > 0."""
        return max((s.weight for s in self.strict.scorers if s.name == ScorerName.PREFIX.value), default=0.0)

    def describe(self) -> str:
        """One line per profile, as ``--help`` prints a named policy."""
        fallback = f"; fallback [{self.fallback.describe(self.params)}]" if self.fallback else ""
        hold = f"; hold {self.hold.name}" if self.fallback else ""
        return f"[{self.strict.describe(self.params)}]{fallback}{hold}"


def resolve(doc: RouterPolicyDocument) -> Chain:
    """The document's chain; raises ValueError when it names what this router does not have."""
    p = params(doc)
    if doc.policy is not None:
        named = registry.lookup(doc.policy.value)
        strict, fallback, hold = named.strict, named.fallback, named.hold
        listed = {s.name for prof in (strict, fallback) if prof is not None for s in prof.scorers}
        for scorer in doc.weights:
            if scorer.value not in listed:
                raise ValueError(
                    f"weights.{scorer.value}: policy {named.name} lists no scorer {scorer.value} (its scorers: "
                    f"{', '.join(sorted(listed)) or 'none'}); drop the weight or spell the chain out in profiles"
                )
    else:
        assert doc.profiles is not None  # the model requires policy or profiles
        strict = _profile(doc.profiles.strict)
        fallback = _profile(doc.profiles.fallback) if doc.profiles.fallback is not None else None
        hold = registry.hold_plugin(HoldName.ALWAYS.value)
    if p.hold_rule:
        hold = registry.hold_plugin(p.hold_rule)
    return Chain(
        doc.label,
        _reweighted(strict, doc.weights, p),
        _reweighted(fallback, doc.weights, p) if fallback is not None else None,
        hold,
        p,
    )


def build(doc: RouterPolicyDocument) -> Scheduling:
    """The router's scheduling for ``doc`` (the same plugins, weights and picker ``--policy`` builds)."""
    chain = resolve(doc)
    shared: dict[str, Scorer] = {}  # one instance of each scorer for both chains (registry.Profile.build)
    strict = chain.strict.build(chain.name, chain.params, shared)
    if chain.fallback is None:
        return Scheduling(strict, strict)
    fallback = chain.fallback.build(f"{chain.name}-best-effort", chain.params, shared)
    return Scheduling(strict, fallback, chain.hold.build(chain.params))


def _spec(profile: Profile, p: PolicyParams) -> dict[str, Any]:
    return {
        "filters": [f.name for f in profile.filters],
        "scorers": [{"plugin": s.name, "weight": s.weight_in(p)} for s in profile.counted(p)],
        "picker": profile.picker.name,
    }


def profiles_document(name: str, p: PolicyParams | None = None) -> RouterPolicyDocument:
    """A named policy spelled out as profiles (what ``registry.build(name, p)`` runs), as a document."""
    p = p or PolicyParams()
    named = registry.lookup(name)
    profiles: dict[str, Any] = {"strict": _spec(named.strict, p)}
    data: dict[str, Any] = {"apiVersion": ROUTER_POLICY_API_VERSION, "kind": ROUTER_POLICY_KIND, "name": name}
    if named.fallback is not None:
        profiles["fallback"] = _spec(named.fallback, p)
        data["hold"] = p.hold_rule or named.hold.name
    bounded = {"loadFactor": p.load_factor, "loadSlack": p.load_slack}
    return RouterPolicyDocument.model_validate(
        {**data, "profiles": profiles, "parameters": {FilterName.BOUNDED_LOAD.value: bounded}}
    )
