"""Compute the status of a pool and of its LoRAAdapters from what the reconcile observed. Pure.

The result is the one status model (``lorapool.api.status``); the reconcile sends its
``to_patch()``. Conditions follow kstatus: Ready (the pool serves), Progressing (it is
converging), Degraded (something needs a human), plus abnormal-true Reconciling and
Stalled. Each carries a CamelCase reason and a message that says what to do.
``merge_conditions`` keeps lastTransitionTime stable while a condition's status does not
change, so an unchanged pool produces an identical status and the operator writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lorapool.api.status import (
    AdapterPhase,
    AdapterStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    LoRAAdapterStatus,
    LoRAPoolStatus,
    PlanStatus,
    condition,
)

READY, PROGRESSING, DEGRADED = ConditionType.READY, ConditionType.PROGRESSING, ConditionType.DEGRADED

# Ready reasons that mean "on its way", not "broken": their Events are Normal, not Warning.
CONVERGING_REASONS = frozenset({"RollingOut", "WaitingForReplicas", "WaitingForRouter"})


@dataclass(frozen=True)
class AdapterResult:
    """What the operator learned about one adapter this reconcile."""

    name: str
    origin: str  # "Inline" or "LoRAAdapter"
    rank: int | None
    phase: AdapterPhase
    message: str = ""

    @property
    def problem(self) -> bool:
        """True when a human must act: refused, clashing, or unreadable with a reason given."""
        return self.phase in (AdapterPhase.FAILED, AdapterPhase.CONFLICT) or (
            self.phase == AdapterPhase.PENDING and bool(self.message)
        )


@dataclass(frozen=True)
class Observed:
    """Everything a pool's status is computed from."""

    generation: int | None
    plan: PlanStatus | None
    plan_errors: Sequence[str]
    adapters: Sequence[AdapterResult]
    desired_replicas: int
    engine: Mapping[str, Any] | None  # Deployment status
    engine_generation_current: bool
    router_ready: bool
    unschedulable: str | None  # scheduler message of a Pending engine pod
    endpoint: str
    selector: str


@dataclass(frozen=True)
class _Replicas:
    existing: int
    ready: int
    updated: int


def pool_status(o: Observed) -> LoRAPoolStatus:
    """The whole ``status`` of a LoRAPool (conditions without timestamps; see merge_conditions)."""
    engine = o.engine or {}
    counts = _Replicas(
        int(engine.get("replicas") or 0), int(engine.get("readyReplicas") or 0), int(engine.get("updatedReplicas") or 0)
    )
    conditions = _invalid_plan_conditions(o) if o.plan_errors else _serving_conditions(o, counts)
    return LoRAPoolStatus(
        observed_generation=o.generation,
        conditions=[*conditions, *_kstatus_conditions(o, conditions[1])],
        plan=o.plan,
        adapters=[
            AdapterStatus(name=a.name, source_kind=a.origin, rank=a.rank, phase=a.phase, message=a.message or None)
            for a in o.adapters
        ],
        adapter_count=len(o.adapters),
        replicas=counts.existing,
        ready_replicas=counts.ready,
        endpoint=o.endpoint,
        selector=o.selector,
    )


def _invalid_plan_conditions(o: Observed) -> list[Condition]:
    message = "; ".join(o.plan_errors)
    return [
        condition(READY, False, "InvalidPlan", message, o.generation),
        condition(PROGRESSING, False, "InvalidPlan", "waiting for the spec to be fixed", o.generation),
        condition(DEGRADED, True, "InvalidPlan", message, o.generation),
    ]


def _serving_conditions(o: Observed, n: _Replicas) -> list[Condition]:
    """Ready, Progressing and Degraded of a pool whose plan is valid."""
    rolled = o.engine_generation_current and n.updated >= o.desired_replicas and n.existing == o.desired_replicas
    serving = n.ready >= o.desired_replicas and rolled and (o.router_ready or o.desired_replicas == 0)
    progressing = _progressing(o, n, rolled)
    if serving:
        ready = condition(READY, True, "PoolReady", _ready_note(o, n), o.generation)
    else:
        ready = condition(READY, False, progressing.reason, progressing.message, o.generation)
    return [ready, progressing, _degraded(o)]


def _progressing(o: Observed, n: _Replicas, rolled: bool) -> Condition:
    g, desired = o.generation, o.desired_replicas
    if o.unschedulable:
        return condition(PROGRESSING, True, "Unschedulable", o.unschedulable, g)
    if not rolled:
        return condition(
            PROGRESSING, True, "RollingOut", f"{n.updated}/{desired} engine pods run the current configuration", g
        )
    if n.ready < desired:
        return condition(PROGRESSING, True, "WaitingForReplicas", f"{n.ready}/{desired} engine pods are ready", g)
    if not o.router_ready and desired:
        return condition(PROGRESSING, True, "WaitingForRouter", "the router has no ready pod yet", g)
    return condition(PROGRESSING, False, "Reconciled", "all objects are applied and ready", g)


def _degraded(o: Observed) -> Condition:
    problems = [f"adapter {a.name}: {a.message}" for a in o.adapters if a.problem]
    if o.unschedulable:
        problems.insert(0, o.unschedulable)
    if not problems:
        return condition(DEGRADED, False, "Healthy", "no adapter or placement problems", o.generation)
    reason = "Unschedulable" if o.unschedulable else "AdapterProblem"
    return condition(DEGRADED, True, reason, "; ".join(problems), o.generation)


def _ready_note(o: Observed, n: _Replicas) -> str:
    """The Ready message of a serving pool; the plan's warnings ride along so `kubectl get` users see them."""
    servable = len([a for a in o.adapters if not a.problem])
    note = f"{n.ready}/{o.desired_replicas} replicas ready, {servable} adapter(s) servable"
    if pending := [a for a in o.adapters if a.phase == AdapterPhase.PENDING]:
        note += f"; rank unknown for {len(pending)}"
    for warning in (o.plan.warnings if o.plan else None) or ():
        note += f"; warning: {warning}"
    return note


def _kstatus_conditions(o: Observed, progressing: Condition) -> list[Condition]:
    """kstatus (Flux, kpt, cli-utils) reads abnormal-true Reconciling/Stalled on custom resources."""
    stalled = bool(o.plan_errors)
    return [
        condition(
            ConditionType.RECONCILING,
            progressing.status == ConditionStatus.TRUE,
            progressing.reason,
            progressing.message,
            o.generation,
        ),
        condition(
            ConditionType.STALLED,
            stalled,
            "InvalidPlan" if stalled else "NotStalled",
            "; ".join(o.plan_errors) if stalled else "the spec can be served",
            o.generation,
        ),
    ]


def invalid_spec_status(problems: Sequence[str], generation: int | None) -> LoRAPoolStatus:
    """Status of a pool whose spec the models refuse: not Ready, Degraded and Stalled; nothing else touched."""
    message = "; ".join(problems)
    failing = {ConditionType.DEGRADED, ConditionType.STALLED}
    return LoRAPoolStatus(
        observed_generation=generation,
        conditions=[condition(t, t in failing, "InvalidSpec", message, generation) for t in ConditionType],
    )


_ADAPTER_REASONS = {
    AdapterPhase.READY: "Servable",
    AdapterPhase.PENDING: "SourceUnreadable",
    AdapterPhase.CONFLICT: "NameConflict",
    AdapterPhase.FAILED: "Invalid",
}


def adapter_reason(phase: AdapterPhase) -> str:
    """The CamelCase reason of a LoRAAdapter's conditions (and of its Warning Event)."""
    return _ADAPTER_REASONS[phase]


def adapter_object_status(pool: str, generation: int | None, r: AdapterResult) -> LoRAAdapterStatus:
    """The status of one LoRAAdapter object attached to ``pool``."""
    ok = r.phase == AdapterPhase.READY
    reason = adapter_reason(r.phase)
    degraded = not (ok or (r.phase == AdapterPhase.PENDING and not r.message))
    return LoRAAdapterStatus(
        observed_generation=generation,
        pool=pool,
        rank=r.rank,
        phase=r.phase,
        message=r.message,
        conditions=[
            condition(READY, ok, reason, r.message or f"served by pool {pool}", generation),
            condition(DEGRADED, degraded, reason, r.message, generation),
        ],
    )


def merge_conditions(old: Sequence[Mapping[str, Any]], new: Sequence[Condition], now: str) -> list[Condition]:
    """New conditions with lastTransitionTime carried over while their status is unchanged."""
    previous = {c.get("type"): c for c in old or ()}
    merged = []
    for cond in new:
        before = previous.get(cond.type)
        stamp = before.get("lastTransitionTime") if before and before.get("status") == cond.status else None
        merged.append(cond.model_copy(update={"last_transition_time": stamp or now}))
    return merged


def status_changed(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """True when writing ``desired`` (a patch) would change what is stored (ignoring other writers' fields)."""
    current = current or {}
    return any(current.get(key) != value for key, value in desired.items())
