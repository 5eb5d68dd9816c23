"""What happens to held requests: which binds next, whether a bind yields, whom to shed, how long
a hold may wait. Pure; the scheduler carries the answers out (resolves the waiters, counts).

Admission (``admission``) decides one request against the backends; dispatch decides among the
requests the router holds, over plain data: the wait queues (``waitqueue.WaitQueues``, each item a
``Held``: its request, the backends it tried, why it waits), fair dispatch's virtual token counter
(``fairness.VirtualTokenCounter``, or None without ``--fair-dispatch``) and the backends' views.

- ``gate``: a ``Bind`` admission gave becomes ``Hold(FAIR)`` when fair dispatch says the request
  yields (``yields``: its adapter is more than the bound ahead of one held for a LoRA slot,
  ``behind``), so the slots its adapter holds drain and the adapter behind gets one.
- ``next_bind``: whenever something frees, which queue's head binds where: only heads that may run
  (``admission.runnable``), in class-then-age order or by the counters, skipping heads that yield.
- ``shed``: the queues are full and a request that is not sheddable arrives: the newest held
  sheddable request is dropped for it, and the 503 its client gets.
- ``wait_limit``: how long a hold waits by its reason (``--max-queue-wait`` for a saturated pool,
  ``--max-wait`` otherwise), bounded by the door (a gateway's message timeout).
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lorapool.api.traffic import Priority
from lorapool.router.core.admission import (
    Admission,
    Bind,
    Hold,
    HoldReason,
    RefusalReason,
    Refuse,
    bind_held,
    runnable,
)
from lorapool.router.core.backend import Backend, Request
from lorapool.router.core.fairness import VirtualTokenCounter
from lorapool.router.core.policy import Scheduling
from lorapool.router.core.waitqueue import WaitQueues


class Held(Protocol):
    """What dispatch reads of a held request."""

    @property
    def req(self) -> Request: ...
    @property
    def tried(self) -> frozenset[str]: ...
    @property
    def reason(self) -> HoldReason: ...


H = TypeVar("H", bound=Held)


@dataclass(frozen=True)
class WaitLimits:
    """How long holds may wait, by reason (the router's ``--max-wait`` and ``--max-queue-wait``)."""

    max_wait_s: float
    max_queue_wait_s: float


@dataclass(frozen=True)
class NextBind(Generic[H]):
    """The held request to bind now: its adapter's queue, the request (that queue's head), where."""

    model: str
    held: H
    bind: Bind


@dataclass(frozen=True)
class Shed(Generic[H]):
    """The held request dropped to make room, and its answer (503, reason shed)."""

    model: str
    held: H
    refusal: Refuse


def wait_limit(reason: HoldReason, limits: WaitLimits, bound_s: float | None = None) -> float:
    """How long a request held for ``reason`` waits before it goes best effort; ``bound_s``: the
    door's own bound (a gateway's message timeout), None: none."""
    limit = limits.max_queue_wait_s if reason == HoldReason.SATURATED else limits.max_wait_s
    return limit if bound_s is None else min(bound_s, limit)


def behind(queues: WaitQueues[H], fairness: VirtualTokenCounter | None) -> list[str]:
    """With fair dispatch, the adapters whose oldest held request waits for a LoRA slot (else none)."""
    if fairness is None or not queues:
        return []
    heads = ((m, queues.head(m)) for m in queues.depths())
    return [m for m, head in heads if head is not None and head.reason == HoldReason.SLOT]


def yields(req: Request, fairness: VirtualTokenCounter | None, waiting: Sequence[str]) -> bool:
    """Fair dispatch keeps its order for LoRA slots too: a request whose adapter is more than the
    bound ahead of an adapter held for a slot (``waiting``, from ``behind``) does not bind, so the
    slots it holds drain and the adapter behind gets one, instead of a flood keeping its slot on
    every replica while the others wait out --max-wait for theirs."""
    return fairness is not None and req.is_adapter and bool(waiting) and fairness.ahead(req.model, waiting)


def gate(decision: Admission, req: Request, fairness: VirtualTokenCounter | None, waiting: Sequence[str]) -> Admission:
    """Admission's decision as it stands under fair dispatch: a ``Bind`` that yields is ``Hold(FAIR)``."""
    if isinstance(decision, Bind) and yields(req, fairness, waiting):
        return Hold(HoldReason.FAIR, "fair-dispatch", f"an adapter behind {req.model!r} waits for a LoRA slot")
    return decision


def next_bind(
    scheduling: Scheduling,
    queues: WaitQueues[H],
    views: Sequence[Backend],
    base_models: Set[str],
    fairness: VirtualTokenCounter | None,
) -> NextBind[H] | None:
    """The held request that binds now and where, or None while none may: the queues' heads in
    class-then-age order (fair dispatch: by the counters first), each asked of the strict policy."""
    only = runnable(views, base_models)
    if only is not None and not only:
        return None
    # Without a free slot only adapters already running somewhere (or the base) can bind:
    # skip the rest without running the policy, which matters with 1000s of queues.
    order = fairness.order if fairness is not None else None
    waiting = behind(queues, fairness)
    for model in queues.models_by_age(None if only is None else only.__contains__, order):
        held = queues.head(model)
        assert held is not None
        if yields(held.req, fairness, waiting):
            continue
        bind = bind_held(scheduling, held.req, views, held.tried, held.reason)
        if bind is not None:
            return NextBind(model, held, bind)
    return None


def shed(req: Request, queues: WaitQueues[H]) -> Shed[H] | None:
    """The queues are full: the newest held sheddable request, dropped to make room for ``req``
    (None when ``req`` is sheddable itself, or nothing sheddable waits), and its client's answer."""
    if req.priority == Priority.SHEDDABLE:
        return None
    victim = queues.newest_of_rank(Priority.SHEDDABLE.rank)
    if victim is None:
        return None
    model, held = victim
    detail = f"{len(queues)} requests were waiting; {req.priority} traffic goes first"
    return Shed(model, held, Refuse(RefusalReason.SHED, model, detail))
