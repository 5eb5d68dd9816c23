"""The router policy document builds the registry's policies: same plugins, weights, picker, decisions."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from lorapool.api.common import RouterPolicy
from lorapool.api.routerpolicy import (
    FilterName,
    HoldName,
    PickerName,
    RouterPolicyDocument,
    ScorerName,
    named_document,
)
from lorapool.router.core import document, registry
from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.document import Overrides, apply, build, flags_document, profiles_document, resolve
from lorapool.router.core.plugin import PolicyParams
from lorapool.router.core.policy import Policy, Scheduling


def test_the_api_names_every_plugin_of_the_registry() -> None:
    """The document's vocabularies (and so the API's) are the registry's, name for name."""
    assert [f.value for f in FilterName] == [p.name for p in registry.FILTERS]
    assert [s.value for s in ScorerName] == [p.name for p in registry.SCORERS]
    assert [p.value for p in PickerName] == [p.name for p in registry.PICKERS]
    assert [h.value for h in HoldName] == [p.name for p in registry.HOLDS]
    assert {p.value for p in RouterPolicy} == set(registry.names())


def _name(part: Callable[..., Any] | object) -> str:
    """A plugin instance's identity: its function (closures carry their parameters in the name) or class."""
    return getattr(part, "__name__", type(part).__name__)


def _shape(policy: Policy) -> tuple[object, ...]:
    return (
        tuple((name, _name(f)) for name, f in policy.filters),
        tuple((_name(s), w) for s, w in policy.scorers),
        type(policy.picker).__name__,
    )


def _backends(rng: random.Random) -> list[Backend]:
    adapters = ("a", "b", "c")
    out = []
    for i in range(rng.randint(1, 4)):
        active = {a: rng.randint(1, 3) for a in adapters if rng.random() < 0.4}
        out.append(
            Backend(
                id=str(i),
                up=rng.random() < 0.9,
                max_loras=rng.randint(1, 3),
                models=None if rng.random() < 0.3 else frozenset(a for a in adapters if rng.random() < 0.8),
                active=active,
                warm=frozenset(a for a in adapters if rng.random() < 0.3),
                cached=frozenset(a for a in adapters if rng.random() < 0.3),
                load=sum(active.values()) + rng.randint(0, 4),
                kv_usage=rng.random(),
            )
        )
    return out


def _decisions(scheduling: Scheduling, seed: int) -> list[object]:
    """What both chains decide for a seeded stream of requests: survivors, the filter that refused,
    the scores and the pick (pickers rotate, so the stream's order matters, as in the router)."""
    rng = random.Random(seed)
    out: list[object] = []
    for _ in range(300):
        req, backends = Request(rng.choice("abcx")), _backends(rng)
        for policy in (scheduling.strict, scheduling.fallback):
            survivors, refused = policy.filter(req, backends)
            out.append(([b.id for b in survivors], refused, policy.scores(req, survivors), policy.pick(req, survivors)))
        if scheduling.hold is not None:
            out.append(scheduling.hold(req, backends))
    return out


PARAMS = {
    "defaults": PolicyParams(),
    "flags": PolicyParams(load_factor=1.5, load_slack=0.5, hold_rule="hold-if-active"),
    "prefix": PolicyParams(prefix_weight=1.5),
}
CASES = [
    (name, pid)
    for name in registry.names()
    for pid in PARAMS
    if pid != "prefix" or name == RouterPolicy.AFFINITY  # the baselines stay prompt-blind
]


def _named(name: str, p: PolicyParams) -> RouterPolicyDocument:
    """A named policy as the flags would say it (``--policy name --load-factor ...``)."""
    return flags_document(
        Overrides(
            policy=name,
            load_factor=p.load_factor,
            load_slack=p.load_slack,
            hold_rule=p.hold_rule or None,
            prefix_weight=p.prefix_weight or None,
        )
    )


@pytest.mark.parametrize(("name", "pid"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
@pytest.mark.parametrize("form", ["named", "profiles"])
def test_each_named_policy_is_a_document_that_decides_the_same(name: str, pid: str, form: str) -> None:
    p = PARAMS[pid]
    doc = _named(name, p) if form == "named" else profiles_document(name, p)
    doc = RouterPolicyDocument.from_json(doc.to_json())  # as the router reads it from the file
    ours, theirs = build(doc), registry.build(name, p)
    assert _shape(ours.strict) == _shape(theirs.strict)
    assert _shape(ours.fallback) == _shape(theirs.fallback)
    assert ours.holds == theirs.holds and ours.hold is theirs.hold
    assert _decisions(ours, seed=7) == _decisions(registry.build(name, p), seed=7)


def test_the_affinity_document_spelled_out() -> None:
    """What docs/router-policy.md shows: the affinity chain as profiles."""
    chain = resolve(profiles_document("affinity"))
    assert chain.describe() == (
        "[healthy > serves-model > bounded-load > lora-slots > saturation | lora-affinity x10 + least-load x1"
        " + rendezvous x0.3 + kv-cache x0.5 | highest-score]; fallback [healthy > serves-model > bounded-load"
        " | lora-affinity x10 + least-load x1 + rendezvous x0.3 + kv-cache x0.5 + slot-pressure x2"
        " | highest-score]; hold hold-always"
    )
    assert chain.prefix_weight == 0


def test_a_stateful_scorer_is_one_instance_for_both_chains() -> None:
    scheduling = build(named_document(RouterPolicy.AFFINITY, weights={ScorerName.PREFIX: 1.5}))
    strict = {_name(s): s for s, _ in scheduling.strict.scorers}
    fallback = {_name(s): s for s, _ in scheduling.fallback.scorers}
    assert strict["PrefixScorer"] is fallback["PrefixScorer"]


def _doc(**fields: Any) -> RouterPolicyDocument:
    return RouterPolicyDocument.model_validate({"apiVersion": "lorapool.io/v1alpha1", "kind": "RouterPolicy", **fields})


CUSTOM = _doc(
    name="sticky",
    profiles={
        "strict": {"filters": ["healthy", "serves-model"], "scorers": [{"plugin": "rendezvous", "weight": 1}]},
        "fallback": {"filters": ["healthy"], "scorers": [{"plugin": "least-load", "weight": 1}]},
    },
    parameters={"bounded-load": {"loadSlack": 4}},
)

OVERRIDE_CASES: dict[str, tuple[RouterPolicyDocument, Overrides, dict[str, Any]]] = {
    "no flag: the document": (CUSTOM, Overrides(), {"name": "sticky", "hold": None, "load_slack": 4.0}),
    "--policy replaces the chain, keeps parameters": (
        CUSTOM,
        Overrides(policy="least-loaded"),
        {"name": "least-loaded", "profiles": None, "load_slack": 4.0},
    ),
    "--hold-rule replaces the hold rule": (CUSTOM, Overrides(hold_rule="hold-if-active"), {"hold": HoldName.IF_ACTIVE}),
    "--load-factor beside the document's slack": (
        CUSTOM,
        Overrides(load_factor=2.0),
        {"load_factor": 2.0, "load_slack": 4.0},
    ),
    "--prefix-weight sets weights.prefix": (
        named_document(RouterPolicy.AFFINITY),
        Overrides(prefix_weight=1.5),
        {"weights": {ScorerName.PREFIX: 1.5}},
    ),
}


@pytest.mark.parametrize(("doc", "flags", "want"), list(OVERRIDE_CASES.values()), ids=list(OVERRIDE_CASES))
def test_flags_given_override_the_documents_knobs(
    doc: RouterPolicyDocument, flags: Overrides, want: dict[str, Any]
) -> None:
    got = apply(doc, flags)
    p = document.params(got)
    seen = {"name": got.label, "hold": got.hold, "profiles": got.profiles, "weights": got.weights}
    seen |= {"load_factor": p.load_factor, "load_slack": p.load_slack}
    assert {k: seen[k] for k in want} == want


def test_the_flags_document_without_flags_is_plain_affinity() -> None:
    """A router with no flag and no file runs the document the operator renders for a default pool."""
    assert flags_document(Overrides(policy="affinity")) == named_document(RouterPolicy.AFFINITY)
    assert flags_document(Overrides()).hash == named_document(RouterPolicy.AFFINITY).hash


ERROR_CASES: dict[str, tuple[Callable[[], object], str]] = {
    "a weight for a scorer the named policy lacks": (
        lambda: build(named_document(RouterPolicy.ROUND_ROBIN, weights={ScorerName.PREFIX: 1.5})),
        "weights.prefix: policy round-robin lists no scorer prefix (its scorers: none); drop the weight",
    ),
    "a flag that breaks the document names itself": (
        lambda: apply(_doc(profiles={"strict": {"filters": ["healthy"]}}), Overrides(hold_rule="hold-always")),
        "--hold-rule over the policy document: document: Value error, hold hold-always needs profiles.fallback",
    ),
}


@pytest.mark.parametrize(("make", "message"), list(ERROR_CASES.values()), ids=list(ERROR_CASES))
def test_what_the_registry_refuses_is_named(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_profiles_with_their_own_weights_per_chain() -> None:
    doc = _doc(
        profiles={
            "strict": {"filters": ["healthy"], "scorers": [{"plugin": "least-load", "weight": 1}]},
            "fallback": {"filters": ["healthy"], "scorers": [{"plugin": "least-load", "weight": 3}]},
        },
        hold="hold-if-active",
    )
    scheduling = build(doc)
    assert [w for _, w in scheduling.strict.scorers] == [1] and [w for _, w in scheduling.fallback.scorers] == [3]
    assert scheduling.hold is registry.hold_plugin("hold-if-active").build(PolicyParams())


def _ids(backends: Sequence[Backend]) -> list[str]:
    return [b.id for b in backends]


def test_a_scorer_weighted_zero_is_left_out() -> None:
    doc = _doc(profiles={"strict": {"filters": ["healthy"], "scorers": [{"plugin": "kv-cache", "weight": 0}]}})
    scheduling = build(doc)
    assert scheduling.strict.scorers == () and not scheduling.holds
    assert _ids(scheduling.strict.filter(Request("a"), [Backend("1"), Backend("2", up=False)])[0]) == ["1"]
