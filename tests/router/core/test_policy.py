"""Table-driven tests of the named policies the registry builds (the plugins: test_plugins.py)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from lorapool.api.common import RouterPolicy
from lorapool.router.core import registry
from lorapool.router.core.backend import Backend, DecisionKind, Request, classify
from lorapool.router.core.filters import bounded_load
from lorapool.router.core.plugin import PolicyParams
from lorapool.router.core.registry import build
from lorapool.router.core.scorers.least_load import PLUGIN as LEAST_LOAD
from lorapool.router.core.scorers.lora_affinity import LEVELS
from lorapool.router.core.scorers.lora_affinity import PLUGIN as LORA_AFFINITY
from lorapool.router.core.scorers.prefix import BLOCK_CHARS, PREFIX_WEIGHT, block_hashes
from lorapool.router.core.scorers.prefix import PLUGIN as PREFIX
from lorapool.router.core.state import BackendState

AFFINITY, LEAST_LOADED, ROUND_ROBIN = RouterPolicy.AFFINITY, RouterPolicy.LEAST_LOADED, RouterPolicy.ROUND_ROBIN

A = Request("a")


def b(bid: str, **kw: Any) -> Backend:
    kw.setdefault("max_loras", 2)
    return Backend(id=bid, **kw)


@dataclass(frozen=True)
class ChooseCase:
    id: str
    policy: RouterPolicy
    req: Request
    backends: list[Backend]
    chosen: str | None
    fallback: str | None = field(default=None)


CHOOSE_CASES = [
    ChooseCase(
        "affinity joins the batch where the adapter runs",
        AFFINITY,
        A,
        [b("1", active={"a": 1}, load=1), b("2", load=0)],
        "1",
    ),
    ChooseCase(
        "affinity keeps a warm adapter within the slack",
        AFFINITY,
        A,
        [b("1", active={"a": 5}, load=5), b("2", active={"x": 1}, load=1)],
        "1",
    ),
    ChooseCase(
        "affinity spreads a hot adapter past the load cap",
        AFFINITY,
        A,
        [b("1", active={"a": 20}, load=20), b("2", active={"x": 1}, load=1)],
        "2",
    ),
    ChooseCase(
        "affinity holds a hot adapter over the cap when no other backend has a slot",
        AFFINITY,
        A,
        [b("1", active={"a": 30}, load=30), b("2", active={"x": 1, "y": 1}, load=2)],
        None,
        "2",
    ),
    ChooseCase(
        "affinity prefers warm over a cold idler",
        AFFINITY,
        A,
        [b("1", warm={"a"}, load=1), b("2", load=0)],
        "1",
    ),
    ChooseCase(
        "affinity prefers the CPU cache over disk",
        AFFINITY,
        A,
        [b("1", load=0), b("2", cached={"a"}, load=1)],
        "2",
    ),
    ChooseCase(
        "affinity avoids a full backend even when it is idler",
        AFFINITY,
        A,
        [b("1", active={"x": 1, "y": 1}, load=2), b("2", active={"z": 3}, load=3)],
        "2",
    ),
    ChooseCase(
        "affinity holds when every backend is full, best effort picks the idler",
        AFFINITY,
        A,
        [b("1", active={"x": 1, "y": 4}, load=5), b("2", active={"z": 1, "w": 1}, load=2)],
        None,
        "2",
    ),
    ChooseCase(
        "affinity skips backends that do not serve the adapter",
        AFFINITY,
        A,
        [b("1", models={"x"}, active={"a": 1}, load=1), b("2", models={"a"}, load=3)],
        "2",
    ),
    ChooseCase("affinity with no backend up", AFFINITY, A, [b("1", up=False)], None, None),
    ChooseCase(
        "least-loaded ignores affinity",
        LEAST_LOADED,
        A,
        [b("1", active={"a": 1}, load=1), b("2", active={"x": 1, "y": 1}, load=0)],
        "2",
    ),
    ChooseCase(
        "round-robin skips down backends",
        ROUND_ROBIN,
        A,
        [b("1", up=False), b("2")],
        "2",
    ),
]


@pytest.mark.parametrize("case", CHOOSE_CASES, ids=lambda c: c.id)
def test_choose(case: ChooseCase) -> None:
    scheduling = build(case.policy)
    assert scheduling.strict.choose(case.req, case.backends) == case.chosen
    expected_fallback = case.chosen if case.chosen is not None else case.fallback
    assert scheduling.fallback.choose(case.req, case.backends) == expected_fallback


def test_the_registry_serves_exactly_the_api_names() -> None:
    """The CRD's spec.router.policy enum, --policy and the registry name the same policies."""
    assert set(registry.POLICIES) == set(RouterPolicy)
    assert registry.names() == ("affinity", "least-loaded", "round-robin")
    assert all(name is policy.name for name, policy in registry.POLICIES.items())


def test_build_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'random' is not one of affinity, least-loaded, round-robin"):
        build("random")
    assert build(AFFINITY).holds and not build(ROUND_ROBIN).holds and not build(LEAST_LOADED).holds


def test_params_reach_the_bounded_load_filter() -> None:
    """--load-factor/--load-slack change the cap: a gap the default slack keeps, slack 0 spreads."""
    backends = [b("1", active={"a": 5}, load=5), b("2", active={"x": 1}, load=1)]
    assert build(AFFINITY).strict.choose(A, backends) == "1"
    assert build(AFFINITY, PolicyParams(load_factor=1.25, load_slack=0.0)).strict.choose(A, backends) == "2"


def test_affinity_levels_outweigh_every_other_scorer_together() -> None:
    """The claim in lora_affinity's docstring, read from the registry: one level step times its
    weight is larger than the sum of the other scorers' weights, so ties only break inside a level
    (in the default policy: the opt-in prefix scorer is off)."""
    profile = registry.POLICIES[AFFINITY].strict
    affinity, *others = profile.counted(PolicyParams())
    assert affinity.name == "lora-affinity"
    step = min(high - low for high, low in itertools.pairwise(LEVELS))
    assert step * affinity.weight > sum(s.weight for s in others)


def test_the_prefix_weight_sits_between_least_load_and_one_affinity_level() -> None:
    """The claim in prefix's docstring: above least-load's whole range, under one level step."""
    step = min(high - low for high, low in itertools.pairwise(LEVELS))
    assert LEAST_LOAD.weight < PREFIX.weight == PREFIX_WEIGHT < step * LORA_AFFINITY.weight


def test_without_the_prefix_weight_the_affinity_policy_is_unchanged() -> None:
    """--prefix-weight 0 (the default) leaves the prefix scorer out of both chains."""
    for params in (PolicyParams(), PolicyParams(prefix_weight=0.0)):
        scheduling = build(AFFINITY, params)
        assert [w for _, w in scheduling.strict.scorers] == [10.0, 1.0, 0.3, 0.5]
        assert [w for _, w in scheduling.fallback.scorers] == [10.0, 1.0, 0.3, 0.5, 2.0]
    on = build(AFFINITY, PolicyParams(prefix_weight=1.2))
    assert [w for _, w in on.strict.scorers] == [10.0, 1.0, 0.3, 0.5, 1.2]
    assert [w for _, w in on.fallback.scorers] == [10.0, 1.0, 0.3, 0.5, 1.2, 2.0]
    assert "prefix" not in registry.POLICIES[AFFINITY].strict.describe()
    assert "prefix x1.2" in registry.POLICIES[AFFINITY].strict.describe(PolicyParams(prefix_weight=1.2))


# A conversation's eight leading blocks for adapter "a": held whole, or only its first two.
HEAD = block_hashes("a", "".join(f"turn {i} ".ljust(BLOCK_CHARS, ".") for i in range(8)))
A_HEAD = Request("a", prepared={PREFIX.name: HEAD})
HELD, QUARTER = HEAD, HEAD[:2]


def pb(bid: str, recent_blocks: tuple[int, ...] = (), **kw: Any) -> tuple[Backend, tuple[int, ...]]:
    """A backend, and the blocks of requests for "a" bound there before (the prefix scorer's state)."""
    return b(bid, **kw), recent_blocks


@dataclass(frozen=True)
class PrefixCase:
    id: str
    backends: list[tuple[Backend, tuple[int, ...]]]
    with_prefix: str | None  # chosen with --prefix-weight 1.5
    without: str | None  # chosen by the default policy (the prefix off)


PREFIX_CASES = [
    PrefixCase(
        "the replica holding the conversation beats a load difference within the cap",
        [pb("held", active={"a": 3}, load=3, recent_blocks=HELD), pb("idle", active={"a": 1}, load=1)],
        "held",
        "idle",
    ),
    PrefixCase(
        "equal prefix scores: least-load decides",
        [pb("busy", active={"a": 3}, load=3, recent_blocks=HELD), pb("idle", active={"a": 1}, load=1, recent_blocks=HELD)],
        "idle",
        "idle",
    ),
    PrefixCase(
        "equal partial prefix scores: least-load decides",
        [pb("busy", active={"a": 3}, load=3, recent_blocks=QUARTER), pb("idle", active={"a": 1}, load=1, recent_blocks=QUARTER)],
        "idle",
        "idle",
    ),
    PrefixCase(
        "a longer leading run wins over a shorter one",
        [pb("all", active={"a": 2}, load=2, recent_blocks=HELD), pb("quarter", active={"a": 1}, load=1, recent_blocks=QUARTER)],
        "all",
        "quarter",
    ),
    PrefixCase(
        "bounded load excludes an over-cap replica whatever its prefix",
        [pb("held", active={"a": 20}, load=20, recent_blocks=HELD), pb("idle", active={"a": 1}, load=1)],
        "idle",
        "idle",
    ),
    PrefixCase(
        "lora-affinity dominates: active beats cold with the whole prefix",
        [pb("active", active={"a": 1}, load=1), pb("cold", load=0, recent_blocks=HELD)],
        "active",
        "active",
    ),
    PrefixCase(
        "the prefix alone crosses no level: active beats warm with the whole prefix",
        [pb("active", active={"a": 1}, load=1), pb("warm", active={"x": 1}, warm={"a"}, load=1, recent_blocks=HELD)],
        "active",
        "active",
    ),
    PrefixCase(
        "a replica whose slots are full stays out whatever its prefix",
        [pb("full", active={"x": 1, "y": 1}, load=2, recent_blocks=HELD), pb("cold", load=0)],
        "cold",
        "cold",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", PREFIX_CASES, ids=lambda c: c.id)
def test_prefix_locality_among_the_adapters_replicas(case: PrefixCase) -> None:
    backends = [x for x, _ in case.backends]
    on = build(AFFINITY, PolicyParams(prefix_weight=PREFIX_WEIGHT))
    for x, blocks in case.backends:  # what was bound where, as the scheduler tells the scorer's hooks
        on.bound(Request("a", prepared={PREFIX.name: blocks}), x.id)
    assert on.strict.choose(A_HEAD, backends) == case.with_prefix
    assert build(AFFINITY).strict.choose(A_HEAD, backends) == case.without


@pytest.mark.parametrize(
    ("backend", "kind"),
    [
        (b("1", active={"a": 1}), DecisionKind.HIT),
        (b("1", active={"x": 1}), DecisionKind.FREE_SLOT),
        (b("1", active={"x": 1, "y": 1}), DecisionKind.MISS),
    ],
    ids=["hit", "free slot", "miss"],
)
def test_classify(backend: Backend, kind: DecisionKind) -> None:
    assert classify(A, backend) is kind


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_affinity_never_exceeds_slots_while_requests_come_and_go(seed: int) -> None:
    """Drive the strict policy with a seeded random stream: no backend ever runs more
    distinct adapters than its slots, and holding happens only when no slot is free for it."""
    rng = random.Random(seed)
    states = [BackendState(f"b{i}", max_loras=3) for i in range(4)]
    for s in states:
        s.mark_up()
    policy = build(AFFINITY).strict
    running: list[tuple[BackendState, str]] = []
    held = 0
    for _ in range(2000):
        if running and rng.random() < 0.45:
            state, model = running.pop(rng.randrange(len(running)))
            state.end(model, is_adapter=True)
            continue
        model = f"a{min(int(rng.paretovariate(1.0)), 30)}"
        views = [s.view() for s in states]
        chosen = policy.choose(Request(model), views)
        if chosen is None:
            held += 1
            # Held only when no backend within the load cap has a slot for it.
            within = bounded_load(1.25, 2.0)(Request(model), views)
            assert not any(v.fits(Request(model)) for v in within)
            continue
        state = next(s for s in states if s.id == chosen)
        state.begin(model, is_adapter=True)
        running.append((state, model))
        assert all(len(s.adapter_inflight) <= s.max_loras for s in states)
    assert held > 0  # the stream does saturate the slots, so holding was exercised


def test_affinity_holds_every_request_that_fits_nowhere_unless_told_otherwise() -> None:
    full = [b("1", active={"x": 1, "y": 1}), b("2", active={"a": 9, "z": 1})]
    cold = [b("1", active={"x": 1, "y": 1}), b("2", active={"z": 1, "w": 1})]
    hold = build(AFFINITY).hold
    assert hold is not None and hold(A, full) and hold(A, cold)
    if_active = build(AFFINITY, PolicyParams(hold_rule="hold-if-active")).hold
    assert if_active is not None and if_active(A, full) and not if_active(A, cold)
    assert build(ROUND_ROBIN, PolicyParams(hold_rule="hold-always")).hold is None  # it never holds
    with pytest.raises(ValueError, match="--hold-rule='sometimes' is not one of hold-always, hold-if-active"):
        build(AFFINITY, PolicyParams(hold_rule="sometimes"))
