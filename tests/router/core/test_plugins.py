"""Every router plugin: one table of cases per plugin, and checks on the registry itself."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

import lorapool.router.core.filters
import lorapool.router.core.scorers
from lorapool.api.report import AdapterReport, ReplicaPhase, ReplicaReport
from lorapool.router.core import registry
from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.filters.bounded_load import bounded_load
from lorapool.router.core.pickers import HighestScore, RoundRobin
from lorapool.router.core.plugin import FilterPlugin, HoldPlugin, PickerPlugin, PolicyParams, ScorerPlugin
from lorapool.router.core.policy import Scorer, ScorerHooks
from lorapool.router.core.scorers import lora_affinity
from lorapool.router.core.scorers.prefix import NAME as PREFIX
from lorapool.router.core.scorers.prefix import PREFIX_WEIGHT, PrefixScorer, block_hashes
from lorapool.router.core.scorers.rendezvous import rendezvous_weight

A = Request("a")
BASE = Request("base", is_adapter=False)
PARAMS = PolicyParams()
# A prompt of four whole 64-character blocks, hashed for adapter "a" and for adapter "b".
HEAD = block_hashes("a", "".join(f"block {i}: ".ljust(64, "x") for i in range(4)))
OTHER_ADAPTER = block_hashes("b", "".join(f"block {i}: ".ljust(64, "x") for i in range(4)))
A_PROMPT = Request("a", prepared={PREFIX: HEAD})
PREFIX_ON = PolicyParams(prefix_weight=PREFIX_WEIGHT)


def b(bid: str, **kw: Any) -> Backend:
    kw.setdefault("max_loras", 2)
    return Backend(id=bid, **kw)


@dataclass(frozen=True)
class Case:
    id: str
    req: Request
    backends: list[Backend]
    # Filters: the ids kept, in order. Scorers: the score per id.
    want: list[str] | dict[str, Any]
    params: PolicyParams = PARAMS
    # A stateful scorer's state: the requests bound to each backend before (told through ``on_bind``).
    bound: tuple[tuple[str, Request], ...] = ()


def sent(bid: str, blocks: tuple[int, ...] | frozenset[int]) -> tuple[str, Request]:
    """A request for "a" whose prompt had ``blocks``, bound to ``bid`` before the case."""
    return bid, Request("a", prepared={PREFIX: tuple(blocks)})


FILTER_CASES: dict[str, list[Case]] = {
    "healthy": [
        Case("drops down", A, [b("1", up=False), b("2")], ["2"]),
        Case("all down leaves none", A, [b("1", up=False)], []),
    ],
    "serves-model": [
        Case("keeps unpolled, drops unlisted", A, [b("1"), b("2", models={"x"})], ["1"]),
        Case("keeps listed", A, [b("1", models={"a"})], ["1"]),
        Case("base model by name", BASE, [b("1", models={"base"}), b("2", models={"a"})], ["1"]),
    ],
    "saturation": [
        Case("keeps backends below their cap", A, [b("1", load=4, capacity=4), b("2", load=3, capacity=4)], ["2"]),
        Case("every backend at its cap leaves none", A, [b("1", load=5, capacity=4)], []),
        Case("no cap keeps every backend", A, [b("1", load=900), b("2", load=0)], ["1", "2"]),
        Case("the base model waits too (a cap counts every request)", BASE, [b("1", load=2, capacity=2)], []),
        Case(
            "keeps backends below their prefill cap",
            A,
            [b("1", load=9, prefilling=2, prefill_capacity=2), b("2", load=9, prefilling=1, prefill_capacity=2)],
            ["2"],
        ),
        Case("a prefill cap leaves the batch uncapped", A, [b("1", load=900, prefill_capacity=2)], ["1"]),
    ],
    "lora-slots": [
        Case(
            "keeps the active adapter on a full backend",
            A,
            [b("1", active={"a": 3, "x": 1}), b("2", active={"x": 1, "y": 1})],
            ["1"],
        ),
        Case("keeps a free slot", A, [b("1", active={"x": 1})], ["1"]),
        Case("drops full backends", A, [b("1", active={"x": 1, "y": 2})], []),
        Case("never blocks the base model", BASE, [b("1", active={"x": 1, "y": 2})], ["1"]),
    ],
    "bounded-load": [
        Case(
            "drops a backend over 1.25x the mean",
            A,
            [b("1", load=6), b("2", load=2)],
            ["2"],
            PolicyParams(1.25, 0.0),
        ),
        Case("keeps both near the mean", A, [b("1", load=3), b("2", load=2)], ["1", "2"], PolicyParams(1.25, 0.0)),
        Case(
            "lets low loads pile up to the ceiling",
            A,
            [b("1", load=1), b("2", load=0)],
            ["1", "2"],
            PolicyParams(1.25, 0.0),
        ),
        Case("slack keeps a small gap", A, [b("1", load=5), b("2", load=1)], ["1", "2"], PolicyParams(1.25, 2.0)),
        Case("slack does not keep a large gap", A, [b("1", load=8), b("2", load=1)], ["2"], PolicyParams(1.25, 2.0)),
        Case("one backend is kept whatever its load", A, [b("1", load=50)], ["1"]),
        Case("equal loads are all kept", A, [b("1", load=9), b("2", load=9)], ["1", "2"], PolicyParams(1.0, 0.0)),
    ],
}

SCORER_CASES: dict[str, list[Case]] = {
    "lora-affinity": [
        Case(
            "levels: active, warm, cached, cold, full",
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
        Case("neutral for the base model", BASE, [b("1", active={"x": 1, "y": 1}), b("2")], {"1": 1.0, "2": 1.0}),
    ],
    "least-load": [
        Case(
            "relative to the busiest",
            A,
            [b("1", load=4), b("2", load=1), b("3", load=0)],
            {"1": 0.0, "2": 0.75, "3": 1.0},
        ),
        Case("all idle score 1", A, [b("1"), b("2")], {"1": 1.0, "2": 1.0}),
    ],
    "kv-cache": [
        Case(
            "free fraction",
            A,
            [b("1", kv_usage=0.9), b("2", kv_usage=0.25)],
            {"1": pytest.approx(0.1), "2": 0.75},
        ),
        Case("empty cache scores 1", A, [b("1", kv_usage=0.0)], {"1": 1.0}),
    ],
    "rendezvous": [
        Case(
            "the pair's hash", A, [b("x"), b("y")], {"x": rendezvous_weight("a", "x"), "y": rendezvous_weight("a", "y")}
        ),
        Case("another model, another hash", BASE, [b("x")], {"x": rendezvous_weight("base", "x")}),
    ],
    "prefix": [
        Case(
            "the longest leading run, as a fraction of the request's blocks",
            A_PROMPT,
            [b("all"), b("half"), b("gap"), b("tail"), b("none")],
            {"all": 1.0, "half": 0.5, "gap": 0.25, "tail": 0.0, "none": 0.0},
            PREFIX_ON,
            bound=(
                sent("all", HEAD),
                sent("half", HEAD[:2]),
                sent("gap", (HEAD[0], HEAD[2], HEAD[3])),
                sent("tail", HEAD[1:]),
            ),
        ),
        Case(
            "salted by the adapter: the same text sent for another adapter scores 0",
            A_PROMPT,
            [b("1")],
            {"1": 0.0},
            PREFIX_ON,
            bound=(sent("1", OTHER_ADAPTER),),
        ),
        Case("no whole block (or the scorer off): 0", A, [b("1")], {"1": 0.0}, PREFIX_ON, bound=(sent("1", HEAD),)),
    ],
    "slot-pressure": [
        Case("fits: 1", A, [b("1", active={"x": 1}), b("2", active={"a": 1, "x": 1})], {"1": 1.0, "2": 1.0}),
        Case("one over: 1/2", A, [b("1", active={"x": 1, "y": 1})], {"1": 0.5}),
        Case("two over: 1/3", A, [b("1", active={"x": 1, "y": 1, "z": 1})], {"1": pytest.approx(1 / 3)}),
        Case("base model never over", BASE, [b("1", active={"x": 1, "y": 1})], {"1": 1.0}),
    ],
}


# Hold rules: whether a request that fits nowhere waits (True) or goes best-effort at once.
HOLD_CASES: dict[str, list[Case]] = {
    "hold-always": [
        Case("holds a cold adapter", A, [b("1", active={"x": 1, "y": 1})], {"hold": True}),
    ],
    "hold-if-active": [
        Case("holds an adapter in flight somewhere", A, [b("1", active={"x": 1, "y": 1}), b("2", active={"a": 9, "z": 1})], {"hold": True}),
        Case("sends a cold adapter at once", A, [b("1", active={"x": 1, "y": 1}), b("2", active={"z": 1, "w": 1})], {"hold": False}),
        Case("warm or cached is not in flight", A, [b("1", active={"x": 1, "y": 1}, warm={"a"}, cached={"a"})], {"hold": False}),
        Case("in flight on a down backend only", A, [b("1", up=False, active={"a": 1}), b("2", active={"x": 1, "y": 1})], {"hold": False}),
    ],
}  # fmt: skip


def plugin_cases(cases: Mapping[str, list[Case]]) -> list[Any]:
    return [pytest.param(name, case, id=f"{name}: {case.id}") for name, table in cases.items() for case in table]


@pytest.mark.parametrize(("name", "case"), plugin_cases(FILTER_CASES))
def test_filter(name: str, case: Case) -> None:
    plugin = registry.PLUGINS[name]
    assert isinstance(plugin, FilterPlugin)
    assert [x.id for x in plugin.build(case.params)(case.req, case.backends)] == case.want


@pytest.mark.parametrize(("name", "case"), plugin_cases(SCORER_CASES))
def test_scorer(name: str, case: Case) -> None:
    plugin = registry.PLUGINS[name]
    assert isinstance(plugin, ScorerPlugin)
    scorer, weight = plugin.build(case.params)
    assert dict(with_state(scorer, case)(case.req, case.backends)) == case.want
    assert weight == plugin.weight > 0


def with_state(scorer: Scorer, case: Case) -> Scorer:
    """``scorer`` told, through its hooks, of the requests ``case`` bound before (stateless: as is)."""
    if isinstance(scorer, ScorerHooks):
        for bid, req in case.bound:
            scorer.on_bind(req, bid)
    else:
        assert not case.bound, "a stateless scorer keeps nothing"
    return scorer


@pytest.mark.parametrize(("name", "case"), plugin_cases(HOLD_CASES))
def test_hold_rule(name: str, case: Case) -> None:
    plugin = registry.PLUGINS[name]
    assert isinstance(plugin, HoldPlugin)
    assert isinstance(case.want, dict)
    assert plugin.build(case.params)(case.req, case.backends) is case.want["hold"]


def test_every_filter_scorer_and_hold_rule_has_a_table() -> None:
    assert set(FILTER_CASES) == {p.name for p in registry.FILTERS}
    assert set(SCORER_CASES) == {p.name for p in registry.SCORERS}
    assert set(HOLD_CASES) == {p.name for p in registry.HOLDS}


def test_bounded_load_names_the_bad_parameter() -> None:
    with pytest.raises(ValueError, match=r"factor=0\.9"):
        bounded_load(0.9)
    with pytest.raises(ValueError, match="slack=-1"):
        bounded_load(1.25, slack=-1)


def test_highest_score_rotates_among_ties_only() -> None:
    pick = registry.PLUGINS["highest-score"]
    assert isinstance(pick, PickerPlugin)
    first = pick.build(PARAMS)
    assert isinstance(first, HighestScore) and first is not pick.build(PARAMS)  # no shared turns
    assert {first({"1": 1.0, "2": 1.0, "3": 0.5}) for _ in range(4)} == {"1", "2"}
    assert first({"1": 0.2, "2": 0.9}) == "2"
    assert first({}) is None


def test_round_robin_cycles_and_ignores_scores() -> None:
    pick = registry.PLUGINS["round-robin"]
    assert isinstance(pick, PickerPlugin)
    turn = pick.build(PARAMS)
    assert isinstance(turn, RoundRobin)
    assert [turn({"2": 0.0, "1": 9.0}) for _ in range(4)] == ["1", "2", "1", "2"]
    assert turn({}) is None


def modules_of(package: Any) -> list[str]:
    return [m.name for m in pkgutil.iter_modules(package.__path__)]


@pytest.mark.parametrize(
    ("package", "registered"),
    [(lorapool.router.core.filters, registry.FILTERS), (lorapool.router.core.scorers, registry.SCORERS)],
    ids=["filters", "scorers"],
)
def test_every_plugin_module_declares_one_registered_plugin(package: Any, registered: Sequence[Any]) -> None:
    declared = [importlib.import_module(f"{package.__name__}.{m}").PLUGIN for m in modules_of(package)]
    assert sorted(p.name for p in declared) == sorted(p.name for p in registered)
    assert all(p in registered for p in declared)


# Values a field can take that differ from every case's defaults; ``id`` is always read.
PERTURBED: dict[str, Any] = {
    "up": False,
    "max_loras": 7,
    "models": frozenset({"zz"}),
    "active": {"q": 1, "r": 2, "s": 1},
    "warm": frozenset({"a", "base"}),
    "cached": frozenset({"a", "base"}),
    "load": 13,
    "kv_usage": 0.77,
    "report": ReplicaReport(engine_healthy=True, adapters={"a": AdapterReport(ReplicaPhase.FAILED, "x")}),
}
BACKEND_FIELDS = {f.name for f in dataclasses.fields(Backend)}
REQUEST_FIELDS = {f.name for f in dataclasses.fields(Request)}


def answer(plugin: FilterPlugin | ScorerPlugin, case: Case, req: Request, backends: Sequence[Backend]) -> Any:
    if isinstance(plugin, FilterPlugin):
        return [x.id for x in plugin.build(PARAMS)(req, backends)]
    return dict(with_state(plugin.build(PARAMS)[0], case)(req, backends))


@pytest.mark.parametrize("plugin", [*registry.FILTERS, *registry.SCORERS], ids=lambda p: p.name)
def test_a_plugin_reads_only_the_fields_it_declares(plugin: FilterPlugin | ScorerPlugin) -> None:
    """Changing any field outside ``reads`` leaves every case's answer unchanged; and the
    module docstring names each field it reads (a claim a reader relies on)."""
    assert set(plugin.reads) <= BACKEND_FIELDS | REQUEST_FIELDS, plugin.reads
    doc = importlib.import_module(plugin.factory.__module__).__doc__ or ""
    assert all(f"``{field}``" in doc for field in plugin.reads), f"{plugin.name}: docstring misses a field it reads"
    assert "Reads:" in doc
    if isinstance(plugin, ScorerPlugin):
        assert "Score" in doc and "Weight" in doc, f"{plugin.name}: docstring gives no score range or weight"
    else:
        assert "Keeps:" in doc, f"{plugin.name}: docstring does not say what the filter keeps"
    cases = (FILTER_CASES | SCORER_CASES)[plugin.name]
    unread = [f for f in PERTURBED if f not in plugin.reads]
    for case in cases:
        before = answer(plugin, case, case.req, case.backends)
        for field in unread:
            changed = [dataclasses.replace(x, **{field: PERTURBED[field]}) for x in case.backends]
            assert answer(plugin, case, case.req, changed) == before, f"{plugin.name} reads {field}"
        if "is_adapter" not in plugin.reads:
            flipped = dataclasses.replace(case.req, is_adapter=not case.req.is_adapter)
            assert answer(plugin, case, flipped, case.backends) == before, f"{plugin.name} reads is_adapter"


def test_a_declared_field_is_really_read() -> None:
    """The check above can fail: lora-affinity's answer does change with ``active``."""
    backends = [b("1"), b("2", active={"x": 1, "y": 1})]
    changed = [dataclasses.replace(x, active=PERTURBED["active"]) for x in backends]
    assert lora_affinity(A, backends) != lora_affinity(A, changed)


# --- a stateful scorer's hooks, shown by the prefix scorer --------------------------------------
TEXT = "".join(f"block {i}: ".ljust(64, "x") for i in range(4))


def prefix_scorer(capacity: int | None = None) -> PrefixScorer:
    plugin = registry.PLUGINS[PREFIX]
    assert isinstance(plugin, ScorerPlugin)
    scorer, _ = plugin.build(PREFIX_ON)
    assert isinstance(scorer, PrefixScorer)
    if capacity is not None:
        scorer.capacity = capacity
    return scorer


@pytest.mark.parametrize(
    ("model", "prompt", "want"),
    [
        ("a", TEXT, HEAD),
        ("b", TEXT, OTHER_ADAPTER),
        ("a", TEXT + "x" * 63, HEAD),
        ("a", "x" * 63, None),
        ("a", "", None),
    ],
    ids=[
        "four whole blocks",
        "salted by the adapter",
        "a partial block is left out",
        "under one block: nothing",
        "no text",
    ],
)
def test_prefix_prepare_hashes_the_prompt_once_salted_by_the_adapter(
    model: str, prompt: str, want: tuple[int, ...] | None
) -> None:
    assert prefix_scorer().prepare(Request(model), prompt) == want


def test_prefix_prepare_keeps_the_hashes_on_the_request_under_its_name() -> None:
    on = registry.build("affinity", PREFIX_ON)
    assert on.prepare(A, TEXT).prepared == {PREFIX: HEAD}
    assert on.prepare(A, "short") is A  # nothing to keep: the same request
    off = registry.build("affinity", PARAMS)
    assert off.hooked == () and off.prepare(A, TEXT) is A  # the scorer off: nothing hashed


@pytest.mark.parametrize(
    ("bound", "want"),
    [
        ((HEAD,), 1.0),
        ((HEAD[:1],), 0.25),
        ((HEAD[1:],), 0.0),
        ((HEAD[:1], HEAD[2:]), 0.25),
        ((HEAD[:2], HEAD[:3]), 0.75),
    ],
    ids=["the whole head", "its first block", "the tail alone counts nothing", "a gap ends the run", "binds add up"],
)
def test_prefix_scores_the_leading_run_of_what_was_bound(bound: tuple[tuple[int, ...], ...], want: float) -> None:
    scorer = prefix_scorer()
    for blocks in bound:
        scorer.on_bind(Request("a", prepared={PREFIX: blocks}), "1")
    assert scorer(A_PROMPT, [b("1"), b("2")]) == {"1": want, "2": 0.0}


def test_prefix_memory_is_bounded_per_backend_and_kept_only_for_backends_bound_to() -> None:
    scorer = prefix_scorer(capacity=3)
    scorer.on_bind(A_PROMPT, "1")  # four blocks into three: the tail goes first, the head stays
    scorer.on_bind(A, "2")  # no blocks: no index made
    indexes = scorer.indexes
    assert set(indexes) == {"1"} and len(indexes["1"]) == 3
    assert scorer(A_PROMPT, [b("1")]) == {"1": 0.75}
    scorer.on_release(A_PROMPT, "1")  # the engine keeps a finished request's prefix
    assert scorer(A_PROMPT, [b("1")]) == {"1": 0.75}


def test_prefix_forgets_a_backend_that_is_reset_and_comes_back_empty() -> None:
    scheduling = registry.build("affinity", PREFIX_ON)
    scheduling.bound(A_PROMPT, "1")
    scheduling.bound(A_PROMPT, "2")
    scheduling.reset("1")  # it went down or left
    (scorer,) = scheduling.hooked
    assert scorer(A_PROMPT, [b("1"), b("2")]) == {"1": 0.0, "2": 1.0}
    scheduling.bound(A, "1")  # it came back: a new engine, its cache empty until a prompt binds there
    assert scorer(A_PROMPT, [b("1"), b("2")]) == {"1": 0.0, "2": 1.0}
    scheduling.bound(A_PROMPT, "1")
    assert scorer(A_PROMPT, [b("1"), b("2")]) == {"1": 1.0, "2": 1.0}


def test_one_stateful_scorer_serves_both_chains_of_a_scheduling() -> None:
    scheduling = registry.build("affinity", PREFIX_ON)
    strict = [s for s, _ in scheduling.strict.scorers if isinstance(s, ScorerHooks)]
    fallback = [s for s, _ in scheduling.fallback.scorers if isinstance(s, ScorerHooks)]
    assert strict == fallback == list(scheduling.hooked) and len(scheduling.hooked) == 1
    assert strict[0] is fallback[0]  # a bind the strict chain saw is what the best-effort chain reads
