"""Dispatch's decisions over held requests, one table each: the wait limit per hold reason, the
fair-dispatch yield, which held request binds next and where, the shed victim (the scheduler that
carries them out: tests/router/test_scheduler_fairness.py, test_scheduler_traffic.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from lorapool.api.traffic import Priority
from lorapool.router.core import dispatch, registry
from lorapool.router.core.admission import Admission, Bind, Hold, HoldReason, RefusalReason, Refuse
from lorapool.router.core.backend import Backend, DecisionKind, Request
from lorapool.router.core.fairness import VirtualTokenCounter
from lorapool.router.core.waitqueue import WaitQueues

LIMITS = dispatch.WaitLimits(max_wait_s=2.0, max_queue_wait_s=30.0)
SCHEDULING = registry.build("affinity")


@dataclass(frozen=True)
class Waiting:
    """A held request as dispatch reads it."""

    req: Request
    tried: frozenset[str] = frozenset()
    reason: HoldReason = HoldReason.SLOT


def queues(*held: tuple[float, Waiting], limit: int = 100) -> WaitQueues[Waiting]:
    """Wait queues holding ``held``, each (since_s, request), in that order."""
    q: WaitQueues[Waiting] = WaitQueues(limit=limit)
    for since_s, w in held:
        q.push(w.req.model, w, since_s, w.req.priority.rank)
    return q


def b(bid: str, **kw: Any) -> Backend:
    kw.setdefault("max_loras", 2)
    kw.setdefault("models", frozenset({"base", "flood", "light", "sql", "chat", "misc"}))
    return Backend(id=bid, **kw)


def counter(**served: int) -> VirtualTokenCounter:
    """A fair-dispatch counter after each adapter, in order, was charged ``served`` requests of 100 tokens."""
    fairness = VirtualTokenCounter()
    for key, n in served.items():
        for _ in range(n):
            fairness.charge(key, 100.0, Priority.STANDARD)
    return fairness


# --- the wait limit -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reason", "bound_s", "want"),
    [
        (HoldReason.SLOT, None, 2.0),
        (HoldReason.FAIR, None, 2.0),
        (HoldReason.LOAD, None, 2.0),
        (HoldReason.SATURATED, None, 30.0),
        (HoldReason.SLOT, 0.15, 0.15),
        (HoldReason.SATURATED, 0.15, 0.15),
        (HoldReason.SLOT, 5.0, 2.0),
    ],
    ids=[
        "slot: --max-wait",
        "fair: --max-wait",
        "load: --max-wait",
        "saturated: --max-queue-wait",
        "a gateway's shorter bound wins",
        "a gateway's bound caps --max-queue-wait too",
        "a longer bound leaves --max-wait",
    ],
)
def test_wait_limit(reason: HoldReason, bound_s: float | None, want: float) -> None:
    assert dispatch.wait_limit(reason, LIMITS, bound_s) == want


# --- the fair-dispatch yield ------------------------------------------------------------------
BIND = Bind("1", DecisionKind.HIT, in_slot=True)
FLOOD, LIGHT = Request("flood"), Request("light")


@dataclass(frozen=True)
class GateCase:
    id: str
    decision: Admission
    req: Request
    fairness: VirtualTokenCounter | None
    behind: list[str]
    want: type  # Bind: it binds; Hold: Hold(FAIR)


GATE_CASES = [
    GateCase("without fair dispatch a bind binds", BIND, FLOOD, None, ["light"], Bind),
    GateCase("nobody held for a slot: it binds", BIND, FLOOD, counter(light=1, flood=4), [], Bind),
    GateCase("more than the bound ahead of one held for a slot: it yields", BIND, FLOOD, counter(light=1, flood=4), ["light"], Hold),
    GateCase("within the bound: it binds", BIND, FLOOD, counter(light=1, flood=2), ["light"], Bind),
    GateCase("only its own adapter is behind: it binds", BIND, FLOOD, counter(light=1, flood=4), ["flood"], Bind),
    GateCase("the base model takes no slot: it binds", BIND, Request("flood", is_adapter=False), counter(light=1, flood=4), ["light"], Bind),
    GateCase("a hold stays the hold it was", Hold(HoldReason.SLOT, "lora-slots"), FLOOD, counter(light=1, flood=4), ["light"], Hold),
]  # fmt: skip


@pytest.mark.parametrize("case", GATE_CASES, ids=lambda c: c.id)
def test_gate(case: GateCase) -> None:
    decided = dispatch.gate(case.decision, case.req, case.fairness, case.behind)
    assert isinstance(decided, case.want)
    if isinstance(decided, Hold) and isinstance(case.decision, Bind):
        assert decided.reason == HoldReason.FAIR and "'flood'" in decided.detail
    elif case.want is Bind:
        assert decided is case.decision


@pytest.mark.parametrize(
    ("held", "fair", "want"),
    [
        ([(1.0, Waiting(LIGHT))], True, ["light"]),
        ([(1.0, Waiting(LIGHT, reason=HoldReason.SATURATED))], True, []),
        ([(1.0, Waiting(LIGHT, reason=HoldReason.LOAD)), (2.0, Waiting(Request("sql")))], True, ["sql"]),
        ([(1.0, Waiting(LIGHT))], False, []),
    ],
    ids=[
        "a head held for a slot",
        "a saturated head is not behind",
        "only slot heads count",
        "without fair dispatch: none",
    ],
)
def test_behind(held: list[tuple[float, Waiting]], fair: bool, want: list[str]) -> None:
    assert dispatch.behind(queues(*held), VirtualTokenCounter() if fair else None) == want


# --- which held request binds next ------------------------------------------------------------
@dataclass(frozen=True)
class NextCase:
    id: str
    held: list[tuple[float, Waiting]]
    backends: list[Backend]
    want: tuple[str, str] | None  # (model, backend) that binds, None: none may
    fairness: VirtualTokenCounter | None = None


CRITICAL_SQL = Request("sql", priority=Priority.CRITICAL)
NEXT_CASES = [
    NextCase("the oldest head binds first", [(1.0, Waiting(Request("chat"))), (2.0, Waiting(Request("sql")))], [b("1")], ("chat", "1")),
    NextCase("a higher class binds before an older head", [(1.0, Waiting(Request("chat"))), (2.0, Waiting(CRITICAL_SQL))], [b("1")], ("sql", "1")),
    NextCase("no backend up: none", [(1.0, Waiting(Request("chat")))], [b("1", up=False)], None),
    NextCase("every backend saturated: none", [(1.0, Waiting(Request("chat")))], [b("1", load=4, capacity=4)], None),
    NextCase(
        "no free slot: only an adapter in flight binds (onto its replica)",
        [(1.0, Waiting(Request("chat"))), (2.0, Waiting(Request("sql")))],
        [b("1", active={"sql": 1, "misc": 1}), b("2", active={"flood": 1, "light": 1})],
        ("sql", "1"),
    ),
    NextCase(
        "a head that tried the only backend with room waits",
        [(1.0, Waiting(Request("chat"), tried=frozenset({"1"})))],
        [b("1"), b("2", active={"flood": 1, "light": 1})],
        None,
    ),
    NextCase(
        "fair dispatch: the smaller counter first, whatever the age",
        [(1.0, Waiting(Request("flood"), reason=HoldReason.SATURATED)), (2.0, Waiting(Request("light"), reason=HoldReason.SATURATED))],
        [b("1")],
        ("light", "1"),
        counter(light=1, flood=4),
    ),
    NextCase(
        "fair dispatch: a head far ahead of one held for a slot yields",
        [(1.0, Waiting(Request("flood"))), (2.0, Waiting(Request("light")))],
        [b("1", active={"flood": 1, "misc": 1})],
        None,
        counter(light=1, flood=4),
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", NEXT_CASES, ids=lambda c: c.id)
def test_next_bind(case: NextCase) -> None:
    held = queues(*case.held)
    chosen = dispatch.next_bind(SCHEDULING, held, case.backends, frozenset({"base"}), case.fairness)
    if case.want is None:
        assert chosen is None
        return
    assert chosen is not None and (chosen.model, chosen.bind.backend) == case.want
    assert chosen.held is held.head(chosen.model)  # the head of its queue, still there: the shell pops it


# --- the shed victim ----------------------------------------------------------------------------
SHEDDABLE = Priority.SHEDDABLE


@pytest.mark.parametrize(
    ("req", "held", "want"),
    [
        (Request("sql"), [(1.0, Waiting(Request("misc", priority=SHEDDABLE))), (2.0, Waiting(Request("chat", priority=SHEDDABLE)))], "chat"),
        (Request("sql", priority=Priority.CRITICAL), [(1.0, Waiting(Request("misc", priority=SHEDDABLE)))], "misc"),
        (Request("sql", priority=SHEDDABLE), [(1.0, Waiting(Request("misc", priority=SHEDDABLE)))], None),
        (Request("sql"), [(1.0, Waiting(Request("chat")))], None),
    ],
    ids=["the newest sheddable one", "for a critical request too", "a sheddable request sheds nobody", "nothing sheddable waits"],
)  # fmt: skip
def test_shed(req: Request, held: list[tuple[float, Waiting]], want: str | None) -> None:
    full = queues(*held, limit=len(held))
    victim = dispatch.shed(req, full)
    if want is None:
        assert victim is None
        return
    assert victim is not None and victim.model == want and victim.held is full.items(want)[-1]
    assert victim.refusal == Refuse(
        RefusalReason.SHED, want, f"{len(held)} requests were waiting; {req.priority} traffic goes first"
    )
    assert victim.refusal.status == 503 and len(full) == len(held)  # decided, not done: the shell removes it
