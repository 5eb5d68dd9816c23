"""Table-driven tests of the pure routing plugins and the named policies."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from lorapool.router.backend import Backend, DecisionKind, Request, classify
from lorapool.router.filters import bounded_load, healthy, lora_slots, serves_model
from lorapool.router.pickers import HighestScore, RoundRobin
from lorapool.router.policies import PolicyName, build
from lorapool.router.scorers import kv_cache, least_load, lora_affinity, rendezvous
from lorapool.router.scorers.rendezvous import rendezvous_weight
from lorapool.router.state import BackendState

A = Request("a")
BASE = Request("base", is_adapter=False)


def b(bid: str, **kw: Any) -> Backend:
    kw.setdefault("max_loras", 2)
    return Backend(id=bid, **kw)


def ids(backends: Sequence[Backend]) -> list[str]:
    return [x.id for x in backends]


@dataclass(frozen=True)
class FilterCase:
    id: str
    filter: Any
    req: Request
    backends: list[Backend]
    kept: list[str]


FILTER_CASES = [
    FilterCase("healthy drops down", healthy, A, [b("1", up=False), b("2")], ["2"]),
    FilterCase("healthy all down leaves none", healthy, A, [b("1", up=False)], []),
    FilterCase("serves keeps unpolled", serves_model, A, [b("1"), b("2", models={"x"})], ["1"]),
    FilterCase("serves keeps listed", serves_model, A, [b("1", models={"a"})], ["1"]),
    FilterCase(
        "slots keep active adapter on full backend",
        lora_slots,
        A,
        [b("1", active={"a": 3, "x": 1}), b("2", active={"x": 1, "y": 1})],
        ["1"],
    ),
    FilterCase("slots keep free slot", lora_slots, A, [b("1", active={"x": 1})], ["1"]),
    FilterCase("slots drop full backends", lora_slots, A, [b("1", active={"x": 1, "y": 2})], []),
    FilterCase(
        "slots never block the base model",
        lora_slots,
        BASE,
        [b("1", active={"x": 1, "y": 2})],
        ["1"],
    ),
    FilterCase(
        "bounded load drops backend over 1.25x mean",
        bounded_load(1.25),
        A,
        [b("1", load=6), b("2", load=2)],
        ["2"],
    ),
    FilterCase(
        "bounded load keeps both near the mean",
        bounded_load(1.25),
        A,
        [b("1", load=3), b("2", load=2)],
        ["1", "2"],
    ),
    FilterCase(
        "bounded load lets low loads pile up to the ceiling",
        bounded_load(1.25),
        A,
        [b("1", load=1), b("2", load=0)],
        ["1", "2"],
    ),
    FilterCase("bounded load of one backend keeps it", bounded_load(1.25), A, [b("1", load=50)], ["1"]),
]


@pytest.mark.parametrize("case", FILTER_CASES, ids=lambda c: c.id)
def test_filter(case: FilterCase) -> None:
    assert ids(case.filter(case.req, case.backends)) == case.kept


def test_bounded_load_rejects_factor_below_one() -> None:
    with pytest.raises(ValueError, match=r"factor=0\.9"):
        bounded_load(0.9)
    with pytest.raises(ValueError, match="slack=-1"):
        bounded_load(1.25, slack=-1)


@dataclass(frozen=True)
class ScoreCase:
    id: str
    scorer: Any
    req: Request
    backends: list[Backend]
    scores: dict[str, float]


SCORE_CASES = [
    ScoreCase(
        "affinity levels",
        lora_affinity,
        A,
        [
            b("active", active={"a": 1, "x": 1}),
            b("warm", active={"x": 1}, warm={"a", "x"}),
            b("cached", cached={"a"}),
            b("cold"),
            b("full", active={"x": 1, "y": 1}, warm={"a"}),
        ],
        {"active": 1.0, "warm": 0.8, "cached": 0.6, "cold": 0.4, "full": 0.0},
    ),
    ScoreCase(
        "affinity is neutral for the base model",
        lora_affinity,
        BASE,
        [b("1", active={"x": 1, "y": 1}), b("2")],
        {"1": 1.0, "2": 1.0},
    ),
    ScoreCase(
        "least load relative to the busiest",
        least_load,
        A,
        [b("1", load=4), b("2", load=1), b("3", load=0)],
        {"1": 0.0, "2": 0.75, "3": 1.0},
    ),
    ScoreCase("least load all idle", least_load, A, [b("1"), b("2")], {"1": 1.0, "2": 1.0}),
    ScoreCase(
        "kv cache free fraction",
        kv_cache,
        A,
        [b("1", kv_usage=0.9), b("2", kv_usage=0.25)],
        {"1": pytest.approx(0.1), "2": 0.75},
    ),
]


@pytest.mark.parametrize("case", SCORE_CASES, ids=lambda c: c.id)
def test_scorer(case: ScoreCase) -> None:
    assert dict(case.scorer(case.req, case.backends)) == case.scores


def test_rendezvous_is_stable_and_differs_per_backend() -> None:
    backends = [b(f"http://10.0.0.{i}:8000") for i in range(8)]
    first = rendezvous(A, backends)
    assert first == rendezvous(A, backends)
    assert all(0.0 <= s < 1.0 for s in first.values())
    assert len(set(first.values())) == len(backends)
    assert rendezvous_weight("a", "x") != rendezvous_weight("b", "x")


def test_highest_score_rotates_among_ties_only() -> None:
    pick = HighestScore()
    assert {pick({"1": 1.0, "2": 1.0, "3": 0.5}) for _ in range(4)} == {"1", "2"}
    assert pick({"1": 0.2, "2": 0.9}) == "2"
    assert pick({}) is None


def test_round_robin_cycles_and_ignores_scores() -> None:
    pick = RoundRobin()
    assert [pick({"2": 0.0, "1": 9.0}) for _ in range(4)] == ["1", "2", "1", "2"]
    assert pick({}) is None


@dataclass(frozen=True)
class ChooseCase:
    id: str
    policy: str
    req: Request
    backends: list[Backend]
    chosen: str | None
    fallback: str | None = field(default=None)


CHOOSE_CASES = [
    ChooseCase(
        "affinity joins the batch where the adapter runs",
        "affinity",
        A,
        [b("1", active={"a": 1}, load=1), b("2", load=0)],
        "1",
    ),
    ChooseCase(
        "affinity keeps a warm adapter within the slack",
        "affinity",
        A,
        [b("1", active={"a": 5}, load=5), b("2", active={"x": 1}, load=1)],
        "1",
    ),
    ChooseCase(
        "affinity spreads a hot adapter past the load cap",
        "affinity",
        A,
        [b("1", active={"a": 20}, load=20), b("2", active={"x": 1}, load=1)],
        "2",
    ),
    ChooseCase(
        "affinity holds a hot adapter over the cap when no other backend has a slot",
        "affinity",
        A,
        [b("1", active={"a": 30}, load=30), b("2", active={"x": 1, "y": 1}, load=2)],
        None,
        "2",
    ),
    ChooseCase(
        "affinity prefers warm over a cold idler",
        "affinity",
        A,
        [b("1", warm={"a"}, load=1), b("2", load=0)],
        "1",
    ),
    ChooseCase(
        "affinity prefers the CPU cache over disk",
        "affinity",
        A,
        [b("1", load=0), b("2", cached={"a"}, load=1)],
        "2",
    ),
    ChooseCase(
        "affinity avoids a full backend even when it is idler",
        "affinity",
        A,
        [b("1", active={"x": 1, "y": 1}, load=2), b("2", active={"z": 3}, load=3)],
        "2",
    ),
    ChooseCase(
        "affinity holds when every backend is full, best effort picks the idler",
        "affinity",
        A,
        [b("1", active={"x": 1, "y": 4}, load=5), b("2", active={"z": 1, "w": 1}, load=2)],
        None,
        "2",
    ),
    ChooseCase(
        "affinity skips backends that do not serve the adapter",
        "affinity",
        A,
        [b("1", models={"x"}, active={"a": 1}, load=1), b("2", models={"a"}, load=3)],
        "2",
    ),
    ChooseCase("affinity with no backend up", "affinity", A, [b("1", up=False)], None, None),
    ChooseCase(
        "least-loaded ignores affinity",
        "least-loaded",
        A,
        [b("1", active={"a": 1}, load=1), b("2", active={"x": 1, "y": 1}, load=0)],
        "2",
    ),
    ChooseCase(
        "round-robin skips down backends",
        "round-robin",
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


def test_build_names_the_choices() -> None:
    assert {p.value for p in PolicyName} == {"affinity", "least-loaded", "round-robin"}
    with pytest.raises(ValueError, match="affinity, least-loaded, round-robin"):
        build("random")
    assert build("affinity").holds and not build("round-robin").holds


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
    policy = build("affinity").strict
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
