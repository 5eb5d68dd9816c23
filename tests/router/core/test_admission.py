"""The pure admission: one table per moment of a request (arrives, a held one may bind, its wait
runs out, the reports change), one row per bind kind, hold reason and refusal reason; and each
refusal's HTTP answer, word for word."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from lorapool.api.common import RouterPolicy
from lorapool.api.report import AdapterReport, ReplicaReport
from lorapool.api.report import ReplicaPhase as P
from lorapool.router.core import registry
from lorapool.router.core.admission import (
    ANSWERS,
    Admission,
    Bind,
    Hold,
    HoldReason,
    Refresh,
    RefusalReason,
    Refuse,
    admit,
    bind_held,
    expire,
    lost_load,
    runnable,
)
from lorapool.router.core.backend import Backend, DecisionKind, Request
from lorapool.router.core.plugin import PolicyParams
from lorapool.router.core.policy import Scheduling
from lorapool.router.core.reports import Standing

A, BASE = Request("a"), Request("base", is_adapter=False)
AFFINITY = registry.build(RouterPolicy.AFFINITY)
IF_ACTIVE = registry.build(RouterPolicy.AFFINITY, PolicyParams(hold_rule="hold-if-active"))
ROUND_ROBIN = registry.build(RouterPolicy.ROUND_ROBIN)
NEVER_HOLDS = Scheduling(AFFINITY.strict, AFFINITY.fallback, hold=None)  # a policy built without a hold rule
RANK_ERROR = "LoRA rank 64 is greater than max_lora_rank 16."


def b(bid: str, **kw: Any) -> Backend:
    kw.setdefault("max_loras", 2)
    return Backend(id=bid, **kw)


def reported(bid: str, phase: P | None = None, *, message: str | None = None, **kw: Any) -> Backend:
    """A backend whose sidecar reports adapter ``a`` in ``phase`` (None: not at all); the model list
    is the report's, as ``BackendState`` builds it (loaded adapters plus the base)."""
    adapters = {} if phase is None else {"a": AdapterReport(phase, "id", "id" if phase == P.LOADED else None, message)}
    models = {"base", "a"} if phase == P.LOADED else {"base"}
    return b(bid, models=models, report=ReplicaReport(engine_healthy=True, adapters=adapters), **kw)


FULL = {"x": 1, "y": 1}  # two other adapters in flight: no slot for a


@dataclass(frozen=True)
class Case:
    id: str
    backends: Sequence[Backend]
    want: Admission
    req: Request = A
    scheduling: Scheduling = AFFINITY
    tried: frozenset[str] = frozenset()
    lists_fresh: bool = True


ADMIT = [
    # --- Bind, one per kind -----------------------------------------------------------------
    Case("bind: hit, the adapter is in flight there", [b("1", active={"a": 1}, load=1), b("2")],
         Bind("1", DecisionKind.HIT, in_slot=True)),
    Case("bind: free slot, cold (a slot load)", [b("1", active={"x": 1}, load=1)],
         Bind("1", DecisionKind.FREE_SLOT, in_slot=False)),
    Case("bind: free slot, warm there (no slot load)", [b("1", warm={"a"}, active={"x": 1}, load=1)],
         Bind("1", DecisionKind.FREE_SLOT, in_slot=True)),
    Case("bind: the base model needs no slot", [b("1", active=FULL, load=2)],
         Bind("1", DecisionKind.HIT, in_slot=True), req=BASE),
    Case("bind: miss, best effort at once (hold-if-active, a cold adapter)", [b("1", active=FULL, load=2)],
         Bind("1", DecisionKind.MISS, in_slot=False, best_effort=True), scheduling=IF_ACTIVE),
    Case("bind: miss, round-robin is slot-blind", [b("1", active=FULL, load=2)],
         Bind("1", DecisionKind.MISS, in_slot=False), scheduling=ROUND_ROBIN),
    Case("bind: a retry skips the backend it tried", [b("1", active={"a": 1}), b("2")],
         Bind("2", DecisionKind.FREE_SLOT, in_slot=False), tried=frozenset({"1"})),
    Case("bind: where the report says loaded", [reported("1"), reported("2", P.LOADED)],
         Bind("2", DecisionKind.FREE_SLOT, in_slot=False)),
    # --- Hold, one per reason ---------------------------------------------------------------
    Case("hold: slot, every backend's slots are taken", [b("1", active=FULL), b("2", active=FULL)],
         Hold(HoldReason.SLOT, "lora-slots")),
    Case("hold: saturated, a slot is free but every replica runs its --max-inflight",
         [b("1", active={"x": 2}, load=2, capacity=2), b("2", active={"a": 1}, load=3, capacity=3)],
         Hold(HoldReason.SATURATED, "saturation")),
    Case("hold: saturated, whatever the hold rule (it is about slots)", [b("1", active={"x": 2}, load=2, capacity=2)],
         Hold(HoldReason.SATURATED, "saturation"), scheduling=IF_ACTIVE),
    Case("bind: below the cap (the cap counts the engine's foreign load too)",
         [b("1", active={"a": 1}, load=4, capacity=4), b("2", active={"x": 1}, load=3, capacity=4)],
         Bind("2", DecisionKind.FREE_SLOT, in_slot=False)),
    Case("bind: no cap (capacity 0) is never saturated", [b("1", active={"a": 1}, load=500)],
         Bind("1", DecisionKind.HIT, in_slot=True)),
    Case("hold: load, loading on one replica, loaded nowhere", [reported("1", P.DOWNLOADING), reported("2")],
         Hold(HoldReason.LOAD, "serves-model", "adapter 'a' is loading on 1 replica(s)")),
    # --- Refuse, one per reason admission gives ---------------------------------------------
    Case("refuse: no backend is up", [b("1", up=False), b("2", up=False)],
         Refuse(RefusalReason.NO_BACKEND_UP, "a", "no backend is up", "healthy")),
    Case("refuse: every backend was tried", [b("1"), b("2", up=False)],
         Refuse(RefusalReason.EVERY_BACKEND_TRIED, "a", "every backend was tried", "healthy"), tried=frozenset({"1"})),
    Case("refuse: loaded only on a replica that is down", [reported("1", P.LOADED, up=False), reported("2")],
         Refuse(RefusalReason.LOADED_ONLY_ON_DOWN, "a",
                "adapter 'a' is loaded only on replicas that are down or were tried (1)", "serves-model", Standing.LOADED)),
    Case("refuse: the policy never holds", [b("1", active=FULL)],
         Refuse(RefusalReason.POLICY_NEVER_HOLDS, "a", "no backend may take the request", "lora-slots"),
         scheduling=NEVER_HOLDS),
    Case("refuse: the load failed everywhere", [reported("1", P.FAILED, message=RANK_ERROR), reported("2")],
         Refuse(RefusalReason.LOAD_FAILED, "a", f"adapter 'a' failed to load on 1 replica(s): {RANK_ERROR}",
                "serves-model", Standing.FAILED)),
    Case("refuse: not in the pool", [reported("1"), reported("2")],
         Refuse(RefusalReason.NOT_IN_POOL, "a",
                "adapter 'a' is not in the pool's adapter set (no replica's sidecar reports it)", "serves-model",
                Standing.UNKNOWN)),
    Case("refuse: no such model, no reports (vLLM's 404)", [b("1", models={"base"})],
         Refuse(RefusalReason.NO_SUCH_MODEL, "a", "", "serves-model", Standing.UNREPORTED)),
    Case("refuse: no such base model", [b("1", models={"base"})],
         Refuse(RefusalReason.NO_SUCH_MODEL, "other", "", "serves-model", Standing.UNREPORTED),
         req=Request("other", is_adapter=False)),
    # --- Refresh: the lists may be stale ----------------------------------------------------
    Case("refresh: nobody lists it, an unreported backend may be stale", [b("1", models={"base"}), reported("2")],
         Refresh(("1",)), lists_fresh=False),
    Case("refresh: not when the lists are fresh", [b("1", models={"base"})],
         Refuse(RefusalReason.NO_SUCH_MODEL, "a", "", "serves-model", Standing.UNREPORTED)),
    Case("refresh: not when every live backend reports", [reported("1"), b("2", models={"base"}, up=False)],
         Refuse(RefusalReason.NOT_IN_POOL, "a",
                "adapter 'a' is not in the pool's adapter set (no replica's sidecar reports it)", "serves-model",
                Standing.UNKNOWN), lists_fresh=False),
]  # fmt: skip


@pytest.mark.parametrize("case", ADMIT, ids=lambda c: c.id)
def test_admit(case: Case) -> None:
    got = admit(case.scheduling, case.req, case.backends, case.tried, lists_fresh=case.lists_fresh)
    assert got == case.want


def test_every_reason_and_kind_has_a_row() -> None:
    """Each bind kind, hold reason and refusal reason admission can give is in a table here."""
    wants = [c.want for c in (*ADMIT, *EXPIRE)]
    assert {w.kind for w in wants if isinstance(w, Bind)} == {
        DecisionKind.HIT,
        DecisionKind.FREE_SLOT,
        DecisionKind.MISS,
    }
    held_by_scheduler = {HoldReason.FAIR}  # fair dispatch's order (scheduler._yields), not the policy
    assert {w.reason for w in wants if isinstance(w, Hold)} | held_by_scheduler == set(HoldReason)
    scheduler_own = {RefusalReason.QUEUE_FULL, RefusalReason.SHED}
    given = {w.reason for w in wants if isinstance(w, Refuse)} | scheduler_own
    assert given == set(RefusalReason)
    assert set(ANSWERS) == set(RefusalReason)


EXPIRE = [
    Case("expire: slot, best effort on the least over-committed", [b("1", active={"x": 1, "y": 3}, load=4), b("2", active=FULL, load=2)],
         Bind("2", DecisionKind.MISS, in_slot=False, best_effort=True)),
    Case("expire: slot, nothing up any more", [b("1", up=False)],
         Refuse(RefusalReason.NO_BACKEND_UP, "a", "no backend is up", "healthy")),
    Case("expire: saturated, best effort over the cap (a cap never loses a request)",
         [b("1", active={"a": 1}, load=2, capacity=2)],
         Bind("1", DecisionKind.HIT, in_slot=True, best_effort=True)),
    Case("expire: load, still loading", [reported("1", P.LOADING), reported("2")],
         Refuse(RefusalReason.STILL_LOADING, "a", "adapter 'a' is loading on 1 replica(s); waited 2 s (--max-wait)",
                "serves-model", Standing.LOADING)),
    Case("expire: load, it failed meanwhile", [reported("1", P.FAILED, message=RANK_ERROR)],
         Refuse(RefusalReason.LOAD_FAILED, "a", f"adapter 'a' failed to load on 1 replica(s): {RANK_ERROR}",
                "serves-model", Standing.FAILED)),
    Case("expire: load, loaded only where it was tried (no replica list)", [reported("1", P.LOADED), reported("2")],
         Refuse(RefusalReason.LOADED_ONLY_ON_DOWN, "a", "adapter 'a' is loaded only on replicas that are down or were tried",
                "serves-model", Standing.LOADED), tried=frozenset({"1"})),
    Case("expire: load, the reports fell silent", [b("1", models={"base"})],
         Refuse(RefusalReason.STILL_LOADING, "a", "adapter 'a' is not loaded on any replica yet; waited 2 s (--max-wait)",
                "serves-model", Standing.UNREPORTED)),
    Case("expire: load, loaded now: bound late, best effort", [reported("1", P.LOADED)],
         Bind("1", DecisionKind.FREE_SLOT, in_slot=False, loaded_late=True, best_effort=True)),
]  # fmt: skip
HOLD_OF = {
    c.id: HoldReason.LOAD
    if c.id.startswith("expire: load")
    else HoldReason.SATURATED
    if c.id.startswith("expire: saturated")
    else HoldReason.SLOT
    for c in EXPIRE
}


@pytest.mark.parametrize("case", EXPIRE, ids=lambda c: c.id)
def test_expire(case: Case) -> None:
    got = expire(case.scheduling, case.req, HOLD_OF[case.id], case.backends, case.tried, max_wait_s=2.0)
    assert got == case.want


@pytest.mark.parametrize(
    ("backends", "reason", "want"),
    [
        ([b("1", active=FULL)], HoldReason.SLOT, None),
        ([b("1", active={"x": 1})], HoldReason.SLOT, Bind("1", DecisionKind.FREE_SLOT, in_slot=False)),
        ([reported("1", P.LOADING)], HoldReason.LOAD, None),
        ([reported("1", P.LOADED)], HoldReason.LOAD, Bind("1", DecisionKind.FREE_SLOT, in_slot=False, loaded_late=True)),
        ([b("1", active={"a": 1}, load=1, capacity=1)], HoldReason.SATURATED, None),
        ([b("1", active={"a": 1}, load=1, capacity=2)], HoldReason.SATURATED, Bind("1", DecisionKind.HIT, in_slot=True)),
    ],
    ids=["slot: still full", "slot: a slot freed", "load: still loading", "load: loaded, a miss though it waited",
         "saturated: still full", "saturated: a request ended"],
)  # fmt: skip
def test_bind_held(backends: list[Backend], reason: HoldReason, want: Bind | None) -> None:
    bind = bind_held(AFFINITY, A, backends, frozenset(), reason)
    assert bind == want
    # held for a slot or a load: never a hit; held because the replicas were full: a hit is the point
    assert bind is None or not bind.hit or reason == HoldReason.SATURATED


@pytest.mark.parametrize(
    ("backends", "want"),
    [
        ([reported("1", P.FAILED, message=RANK_ERROR)], RefusalReason.LOAD_FAILED),
        ([reported("1")], RefusalReason.NOT_IN_POOL),
        ([reported("1", P.UNLOADING)], RefusalReason.NOT_IN_POOL),
        ([reported("1", P.LOADING)], None),
        ([reported("1", P.LOADED)], None),
        ([b("1")], None),
    ],
    ids=["failed", "gone from every report", "being unloaded", "still loading", "loaded", "no reports"],
)
def test_lost_load(backends: list[Backend], want: RefusalReason | None) -> None:
    refusal = lost_load("a", backends)
    assert (refusal.reason if refusal is not None else None) == want


@pytest.mark.parametrize(
    ("backends", "want"),
    [
        ([b("1", up=False, active={"a": 1})], frozenset()),
        ([b("1", active=FULL), b("2", active={"z": 1})], None),
        ([b("1", active=FULL), b("2", active={"z": 1, "w": 1}), b("3", up=False, active={"q": 1})],
         frozenset({"x", "y", "z", "w", "base"})),
        ([b("1", active={"x": 1}, load=2, capacity=2), b("2", active=FULL, load=3, capacity=3)], frozenset()),
        ([b("1", active={"x": 1}, load=2, capacity=2), b("2", active=FULL, load=2, capacity=3)],
         frozenset({"x", "y", "base"})),
    ],
    ids=["nothing up: none", "a free slot: any", "all full: what runs, and the base",
         "every replica saturated: none", "a free slot only where saturated: what runs below the cap"],
)  # fmt: skip
def test_runnable(backends: list[Backend], want: frozenset[str] | None) -> None:
    assert runnable(backends, frozenset({"base"})) == want


# Each refusal as the client reads it (the HTTP router answers these, word for word, as before).
ANSWER_CASES = {
    RefusalReason.NO_BACKEND_UP: (
        Refuse(RefusalReason.NO_BACKEND_UP, "a", "no backend is up"),
        503, "ServiceUnavailable", "no backend can serve 'a' now (no backend is up); retry later", None,
    ),
    RefusalReason.EVERY_BACKEND_TRIED: (
        Refuse(RefusalReason.EVERY_BACKEND_TRIED, "a", "every backend was tried"),
        503, "ServiceUnavailable", "no backend can serve 'a' now (every backend was tried); retry later", None,
    ),
    RefusalReason.LOADED_ONLY_ON_DOWN: (
        Refuse(RefusalReason.LOADED_ONLY_ON_DOWN, "a", "adapter 'a' is loaded only on replicas that are down or were tried (1)"),
        503, "ServiceUnavailable",
        "no backend can serve 'a' now (adapter 'a' is loaded only on replicas that are down or were tried (1)); retry later", None,
    ),
    RefusalReason.POLICY_NEVER_HOLDS: (
        Refuse(RefusalReason.POLICY_NEVER_HOLDS, "a", "no backend may take the request"),
        503, "ServiceUnavailable", "no backend can serve 'a' now (no backend may take the request); retry later", None,
    ),
    RefusalReason.STILL_LOADING: (
        Refuse(RefusalReason.STILL_LOADING, "a", "adapter 'a' is loading on 1 replica(s); waited 2 s (--max-wait)"),
        503, "ServiceUnavailable", "adapter 'a' is loading on 1 replica(s); waited 2 s (--max-wait); retry later", None,
    ),
    RefusalReason.LOAD_FAILED: (
        Refuse(RefusalReason.LOAD_FAILED, "a", f"adapter 'a' failed to load on 1 replica(s): {RANK_ERROR}"),
        404, "NotFoundError", f"adapter 'a' failed to load on 1 replica(s): {RANK_ERROR}", "model",
    ),
    RefusalReason.NOT_IN_POOL: (
        Refuse(RefusalReason.NOT_IN_POOL, "a", "adapter 'a' is not in the pool's adapter set"),
        404, "NotFoundError", "adapter 'a' is not in the pool's adapter set", "model",
    ),
    RefusalReason.NO_SUCH_MODEL: (
        Refuse(RefusalReason.NO_SUCH_MODEL, "a"), 404, "NotFoundError", "The model `a` does not exist.", "model",
    ),
    RefusalReason.QUEUE_FULL: (
        Refuse(RefusalReason.QUEUE_FULL, "a", "5 requests are already waiting"),
        429, "RateLimitError", "the router is saturated (5 requests are already waiting); retry later", None,
    ),
    RefusalReason.SHED: (
        Refuse(RefusalReason.SHED, "a", "5 requests were waiting; critical traffic goes first"),
        503, "ServiceUnavailable",
        "the pool is saturated and 'a' is sheddable (5 requests were waiting; critical traffic goes first); retry later",
        None,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("refusal", "status", "error_type", "message", "param"), ANSWER_CASES.values(), ids=ANSWER_CASES.keys()
)
def test_a_refusal_knows_its_answer(
    refusal: Refuse, status: int, error_type: str, message: str, param: str | None
) -> None:
    assert (refusal.status, refusal.error_type, refusal.message, refusal.param) == (status, error_type, message, param)
    assert refusal.retry == (status != 404)  # 503 and 429 carry Retry-After


def test_every_refusal_has_an_answer_case() -> None:
    assert set(ANSWER_CASES) == set(RefusalReason)


@pytest.mark.parametrize("name", list(registry.POLICIES), ids=str)
def test_every_named_policy_starts_with_healthy_then_serves_model(name: RouterPolicy) -> None:
    """Admission reads which filter refused from these two (nothing up: 503; not served: the reports)."""
    scheduling = registry.build(name)
    for policy in (scheduling.strict, scheduling.fallback):
        assert [n for n, _ in policy.filters[:2]] == ["healthy", "serves-model"], policy.name
