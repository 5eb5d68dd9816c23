"""Compute a pool's status from what the reconcile observed. Pure.

Conditions follow kstatus: Ready (the pool serves), Progressing (it is converging),
Degraded (something needs a human). Each carries a CamelCase reason and a message
that says what to do. ``merge_conditions`` keeps lastTransitionTime stable when a
condition's status does not change, so an unchanged pool produces an identical status
and the operator writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AdapterResult:
    """What the operator learned about one adapter this reconcile."""

    name: str
    origin: str
    rank: int | None
    phase: str  # Pending | Ready | Failed | Conflict
    message: str = ""


@dataclass(frozen=True)
class Observed:
    """Everything a pool's status is computed from."""

    generation: int | None
    plan: Mapping[str, Any] | None
    plan_errors: Sequence[str]
    adapters: Sequence[AdapterResult]
    desired_replicas: int
    engine: Mapping[str, Any] | None  # Deployment status
    engine_generation_current: bool
    router_ready: bool
    unschedulable: str | None  # scheduler message of a Pending engine pod
    endpoint: str
    selector: str
    warnings: Sequence[str] = field(default=())


def condition(type_: str, status: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def pool_status(o: Observed) -> dict[str, Any]:
    """The whole ``status`` of a LoRAPool (conditions without timestamps; see merge_conditions)."""
    engine = o.engine or {}
    replicas = int(engine.get("replicas") or 0)
    ready = int(engine.get("readyReplicas") or 0)
    updated = int(engine.get("updatedReplicas") or 0)
    failed = [a for a in o.adapters if a.phase in ("Failed", "Conflict") or (a.phase == "Pending" and a.message)]
    pending_meta = [a for a in o.adapters if a.phase == "Pending"]
    g = o.generation

    if o.plan_errors:
        message = "; ".join(o.plan_errors)
        conditions = [
            condition("Ready", False, "InvalidPlan", message, g),
            condition("Progressing", False, "InvalidPlan", "waiting for the spec to be fixed", g),
            condition("Degraded", True, "InvalidPlan", message, g),
        ]
    else:
        rolled = o.engine_generation_current and updated >= o.desired_replicas and replicas == o.desired_replicas
        serving = ready >= o.desired_replicas and rolled and (o.router_ready or o.desired_replicas == 0)
        if o.unschedulable:
            progressing = condition("Progressing", True, "Unschedulable", o.unschedulable, g)
        elif not rolled:
            progressing = condition(
                "Progressing",
                True,
                "RollingOut",
                f"{updated}/{o.desired_replicas} engine pods run the current configuration",
                g,
            )
        elif ready < o.desired_replicas:
            progressing = condition(
                "Progressing", True, "WaitingForReplicas", f"{ready}/{o.desired_replicas} engine pods are ready", g
            )
        elif not o.router_ready and o.desired_replicas:
            progressing = condition("Progressing", True, "WaitingForRouter", "the router has no ready pod yet", g)
        else:
            progressing = condition("Progressing", False, "Reconciled", "all objects are applied and ready", g)
        problems = [f"adapter {a.name}: {a.message}" for a in failed]
        if o.unschedulable:
            problems.insert(0, o.unschedulable)
        degraded = (
            condition(
                "Degraded", True, "Unschedulable" if o.unschedulable else "AdapterProblem", "; ".join(problems), g
            )
            if problems
            else condition("Degraded", False, "Healthy", "no adapter or placement problems", g)
        )
        if serving:
            note = f"{ready}/{o.desired_replicas} replicas ready, {len(o.adapters) - len(failed)} adapter(s) servable"
            if pending_meta:
                note += f"; rank unknown for {len(pending_meta)}"
            readyc = condition("Ready", True, "PoolReady", note, g)
        else:
            readyc = condition("Ready", False, progressing["reason"], progressing["message"], g)
        conditions = [readyc, progressing, degraded]

    # kstatus (Flux, kpt, cli-utils) reads abnormal-true Reconciling/Stalled on custom resources.
    progressing_c = next(c for c in conditions if c["type"] == "Progressing")
    stalled = bool(o.plan_errors)
    conditions += [
        condition(
            "Reconciling", progressing_c["status"] == "True", progressing_c["reason"], progressing_c["message"], g
        ),
        condition(
            "Stalled",
            stalled,
            "InvalidPlan" if stalled else "NotStalled",
            "; ".join(o.plan_errors) if stalled else "the spec can be served",
            g,
        ),
    ]
    return {
        "observedGeneration": g,
        "conditions": conditions,
        "plan": dict(o.plan) if o.plan else None,
        "adapters": [
            {
                k: v
                for k, v in {
                    "name": a.name,
                    "sourceKind": a.origin,
                    "rank": a.rank,
                    "phase": a.phase,
                    "message": a.message,
                }.items()
                if v not in (None, "")
            }
            for a in o.adapters
        ],
        "adapterCount": len(o.adapters),
        "replicas": replicas,
        "readyReplicas": ready,
        "endpoint": o.endpoint,
        "selector": o.selector,
    }


def merge_conditions(old: Sequence[Mapping[str, Any]], new: Sequence[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """New conditions with lastTransitionTime carried over while their status is unchanged."""
    previous = {c.get("type"): c for c in old or ()}
    merged = []
    for cond in new:
        before = previous.get(cond["type"])
        stamp = before.get("lastTransitionTime") if before and before.get("status") == cond["status"] else None
        merged.append({**cond, "lastTransitionTime": stamp or now})
    return merged


def status_changed(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """True when writing ``desired`` would change what is stored (ignoring other writers' fields)."""
    current = current or {}
    return any(current.get(key) != value for key, value in desired.items())
