"""Compute the status of a pool and of its LoRAAdapters from what the reconcile observed. Pure.

The result is the one status model (``lorapool.api.status``); the reconcile sends its
``to_patch()``. Conditions follow kstatus: Ready (the pool serves), Progressing (it is
converging), Degraded (something needs a human), plus abnormal-true Reconciling and
Stalled. Each carries a CamelCase reason and a message that says what to do.
``merge_conditions`` keeps lastTransitionTime stable while a condition's status does not
change, so an unchanged pool produces an identical status and the operator writes nothing.

Adapters are judged twice: the operator's verdict (``AdapterResult``: source read, rank,
base model; Accepted) and what the engines hold (``Presence``: the sidecars' reports on
Ready engine pods; Ready and ``loadedReplicas``). docs/status.md has the words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.clock import rfc3339
from lorapool.api.routerpolicy import PolicyState
from lorapool.api.status import (
    AdapterPhase,
    AdapterProblem,
    AdapterStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    EngineVersionStatus,
    LoRAAdapterStatus,
    LoRAPoolStatus,
    PlanStatus,
    condition,
)
from lorapool.api.vllm_versions import release_of
from lorapool.controller.books import SharedBooksObserved, shared_books_condition
from lorapool.controller.gateway import GatewayObserved, inference_pool_condition
from lorapool.plan.holders import Placement

READY, PROGRESSING, DEGRADED = ConditionType.READY, ConditionType.PROGRESSING, ConditionType.DEGRADED
ACCEPTED = ConditionType.ACCEPTED
POOL_CONDITIONS = (READY, PROGRESSING, DEGRADED, ConditionType.RECONCILING, ConditionType.STALLED)

NO_ROOM = "NoRoom"  # an adapter placed on no replica: every replica's CPU cache (maxCpuLoras) is taken
# Ready reasons that mean "on its way", not "broken": their Events are Normal, not Warning.
CONVERGING_REASONS = frozenset({"RollingOut", "WaitingForReplicas", "WaitingForRouter"})


@dataclass(frozen=True)
class AdapterResult:
    """The operator's verdict on one adapter this reconcile (before any engine has a say).

    ``phase`` is LOADING when the adapter is accepted (valid, part of the desired set),
    PENDING when its rank is unknown, FAILED or CONFLICT when refused; ``served_phase``
    turns it into the phase status shows once the engines' reports are known.
    """

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
class Presence:
    """One adapter across the engine replicas, from their sidecars' reports."""

    loaded: int = 0  # Ready, non-terminating replicas holding it at the desired identity
    loading: int = 0  # replicas downloading, verifying or loading it
    failures: tuple[str, ...] = ()  # "<pod>: <the engine's or source's reason>", one per failing replica
    revisions: tuple[str, ...] = ()  # what the loaded copies' sources resolved to (an OCI digest), sorted, distinct

    @property
    def failed(self) -> bool:
        """Every replica that tried gave up: none holds it, none is still at it, some failed."""
        return bool(self.failures) and not self.loaded and not self.loading

    def failure_message(self) -> str:
        first = self.failures[0].split(": ", 1)[-1] if self.failures else ""
        return f"failed to load on {len(self.failures)} replica(s): {first}"


NOWHERE = Presence()


def served_phase(r: AdapterResult, p: Presence) -> AdapterPhase:
    """The phase status shows: the verdict, promoted to Ready by a replica that holds it, or Failed by the engines."""
    if r.phase in (AdapterPhase.FAILED, AdapterPhase.CONFLICT):
        return r.phase
    if p.loaded:
        return AdapterPhase.READY
    if p.failed:
        return AdapterPhase.FAILED
    return r.phase


def served_message(r: AdapterResult, p: Presence) -> str:
    """The verdict's message, else the engines' reason when a replica failed to load it."""
    if r.message:
        return r.message
    return p.failure_message() if p.failures else ""


@dataclass(frozen=True)
class RouterPolicyObserved:
    """What the pool's router pods (not terminating) say of their policy document, beside the one rendered."""

    expected: str  # the hash of the <pool>-router-policy document this reconcile rendered
    routers: tuple[tuple[str, PolicyState | None], ...]  # pod name -> its published state (None: none yet)


def router_policy_condition(o: RouterPolicyObserved, generation: int | None) -> Condition:
    """RouterPolicyAccepted: False while a router pod reports an edit it refused (it runs the last good
    document), True when every reporting router runs a document, Unknown while none has reported."""
    kind = ConditionType.ROUTER_POLICY_ACCEPTED
    refused = [(pod, st) for pod, st in o.routers if st is not None and st.refused is not None]
    if refused:
        pod, st = refused[0]
        more = f" (and {len(refused) - 1} more router pod(s))" if len(refused) > 1 else ""
        message = (
            f"router pod {pod}{more} refused policy document {st.refused}: {st.reason}; it runs {st.running}, "
            "the last good one: fix spec.router (or the ConfigMap's policy.json) so the routers accept it"
        )
        return condition(kind, False, "Refused", message, generation)
    reporting = [(pod, st) for pod, st in o.routers if st is not None]
    if not reporting:
        message = "no router pod has reported its policy document yet" if o.routers else "no router pod runs"
        return Condition(type=kind.value, status=ConditionStatus.UNKNOWN.value, reason="NotReported",
                         message=message, observed_generation=generation)  # fmt: skip
    current = sum(st.running == o.expected for _, st in reporting)
    message = f"{current}/{len(o.routers)} router pod(s) run policy document {o.expected}"
    if current < len(reporting):
        others = sorted({st.running for _, st in reporting if st.running != o.expected})
        message += f"; {len(reporting) - current} run {', '.join(others)} (a flag over it, or not re-read yet)"
    return condition(kind, True, "Accepted", message, generation)


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
    endpoint: str  # empty without the HTTP door
    selector: str
    presence: Mapping[str, Presence] = field(default_factory=dict)  # adapter name -> what the engines hold
    placement: Placement | None = None  # where each adapter lives (plan.holders)
    gateway: GatewayObserved | None = None  # the gateway door (controller.gateway); None with frontDoor router
    engine_versions: Mapping[str | None, int] = field(
        default_factory=dict
    )  # vLLM version -> Ready pods (None: unknown)
    router_policy: RouterPolicyObserved | None = None  # the routers' policy state; None: not observed
    shared_books: SharedBooksObserved | None = None  # the routers' shared books (controller.books); None: not observed

    def of(self, name: str) -> Presence:
        return self.presence.get(name, NOWHERE)


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
    door = [inference_pool_condition(o.gateway, o.generation)] if o.gateway is not None else []
    if o.router_policy is not None:
        door.append(router_policy_condition(o.router_policy, o.generation))
    if o.shared_books is not None and (books := shared_books_condition(o.shared_books, o.generation)) is not None:
        door.append(books)  # a status only: it never holds Ready back (docs/high-availability.md)
    entries = [_adapter_status(a, o.of(a.name), o.placement, o.desired_replicas) for a in o.adapters]
    listed = bounded_entries(entries)
    return LoRAPoolStatus(
        observed_generation=o.generation,
        conditions=[*conditions, _available(o, counts), *_kstatus_conditions(o, conditions[1]), *door],
        plan=o.plan,
        placement=o.placement.status if o.placement else None,
        adapters=listed,
        adapter_count=len(o.adapters),
        adapters_truncated=True if len(listed) < len(entries) else None,
        adapter_phases=phase_counts(entries),
        worst_adapters=worst_adapters(entries) or None,
        replicas=counts.existing,
        ready_replicas=counts.ready,
        endpoint=o.endpoint or None,
        inference_pool=o.gateway.ref if o.gateway is not None else None,
        selector=o.selector,
        engine_versions=engine_versions(o.engine_versions),
    )


MAX_VERSIONS = 8
# LoRAAdapter objects listed in status.adapters (every inline one is: the CRD caps those at 1,000). At
# ~190 bytes an entry, 2,000 entries keep the pool under 400 KB: a quarter of etcd's 1.5 MiB request limit.
MAX_LISTED_OBJECTS = 1000
MAX_WORST = 20  # status.worstAdapters
MAX_ENTRY_MESSAGE = 512  # characters of one adapter's message in the pool's status (its object has all)
MAX_DEGRADED_PROBLEMS = 10  # problems the Degraded message spells out; the rest are counted


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def severity(entry: AdapterStatus) -> int:
    """How much an adapter needs a human, lowest first: refused, unreadable, unplaced, waiting, loading, ready."""
    if entry.phase in (AdapterPhase.FAILED, AdapterPhase.CONFLICT):
        return 0
    if entry.phase == AdapterPhase.PENDING and entry.message:
        return 1
    if entry.message:
        return 2
    return {AdapterPhase.PENDING: 3, AdapterPhase.LOADING: 4}.get(entry.phase, 5)


def bounded_entries(entries: Sequence[AdapterStatus]) -> list[AdapterStatus]:
    """Every inline entry and at most ``MAX_LISTED_OBJECTS`` LoRAAdapter entries (the worst ones kept),
    in their original order: a pool's status stays far below etcd's request limit at any catalogue size."""
    objects = [e for e in entries if e.source_kind != "Inline"]
    if len(objects) <= MAX_LISTED_OBJECTS:
        return list(entries)
    kept = {id(e) for e in sorted(objects, key=lambda e: (severity(e), e.name))[:MAX_LISTED_OBJECTS]}
    return [e for e in entries if e.source_kind == "Inline" or id(e) in kept]


def phase_counts(entries: Sequence[AdapterStatus]) -> dict[str, int]:
    """Adapters per phase, over all of them (listed or not)."""
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.phase.value] = counts.get(entry.phase.value, 0) + 1
    return counts


def worst_adapters(entries: Sequence[AdapterStatus]) -> list[AdapterProblem]:
    """The adapters a human must fix (refused, clashing, unreadable), worst first, at most ``MAX_WORST``."""
    problems = sorted((e for e in entries if severity(e) <= 1), key=lambda e: (severity(e), e.name))
    return [
        AdapterProblem(name=e.name, source_kind=e.source_kind, phase=e.phase, message=e.message or "")
        for e in problems[:MAX_WORST]
    ]


def engine_versions(counts: Mapping[str | None, int]) -> list[EngineVersionStatus]:
    """The releases the Ready engines report, most replicas first (bounded; a rollout has two)."""
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0] is None, kv[0] or ""))[:MAX_VERSIONS]
    return [
        EngineVersionStatus(version=v or "unknown", replicas=n, supported=v is not None and release_of(v) is not None)
        for v, n in rows
    ]


def _adapter_status(a: AdapterResult, p: Presence, placement: Placement | None, replicas: int) -> AdapterStatus:
    served = a.phase not in (AdapterPhase.FAILED, AdapterPhase.CONFLICT)
    placed = placement.placed(a.name, replicas) if placement and served else None
    k = placement.k.get(a.name) if placement and served else None
    message = served_message(a, p)
    if served and not message:
        message = unplaced_message(placement, a.name)
    return AdapterStatus(
        name=a.name,
        source_kind=a.origin,
        rank=a.rank,
        phase=served_phase(a, p),
        loaded_replicas=p.loaded if served else None,
        message=_clip(message, MAX_ENTRY_MESSAGE) or None,
        placed_replicas=placed,
        target_replicas=k.k if k else None,
        target_changed_at=rfc3339(k.changed_at_s) if k else None,
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


def _available(o: Observed, n: _Replicas) -> Condition:
    """Whether the pool serves requests now, as a Deployment's Available: some engine replica is ready
    (on any pod template: a roll or a lost replica keeps it True) and so is a router."""
    g = o.generation
    if o.desired_replicas == 0:
        return condition(ConditionType.AVAILABLE, False, "ScaledToZero", "spec.replicas is 0: nothing serves", g)
    if n.ready == 0:
        why = o.unschedulable or f"0/{o.desired_replicas} engine pods are ready"
        return condition(ConditionType.AVAILABLE, False, "NoReadyReplicas", why, g)
    if not o.router_ready:
        return condition(ConditionType.AVAILABLE, False, "WaitingForRouter", "the router has no ready pod", g)
    message = f"{n.ready}/{o.desired_replicas} engine pods and a router are ready"
    return condition(ConditionType.AVAILABLE, True, "MinimumReplicasAvailable", message, g)


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
    problems += [
        f"adapter {a.name}: {o.of(a.name).failure_message()}"
        for a in o.adapters
        if not a.problem and o.of(a.name).failures
    ]
    if o.placement and o.placement.status.unplaced:
        problems.append(f"placement: {o.placement.status.reason}")
    if o.unschedulable:
        problems.insert(0, o.unschedulable)
    if not problems:
        return condition(DEGRADED, False, "Healthy", "no adapter or placement problems", o.generation)
    reason = "Unschedulable" if o.unschedulable else "AdapterProblem"
    shown = [_clip(p, MAX_ENTRY_MESSAGE) for p in problems[:MAX_DEGRADED_PROBLEMS]]
    if len(problems) > MAX_DEGRADED_PROBLEMS:
        shown.append(
            f"and {len(problems) - MAX_DEGRADED_PROBLEMS} more problem(s): see status.worstAdapters, "
            "status.adapterPhases and `kubectl get loraadapters`"
        )
    return condition(DEGRADED, True, reason, "; ".join(shown), o.generation)


def _ready_note(o: Observed, n: _Replicas) -> str:
    """The Ready message of a serving pool; the plan's warnings ride along so `kubectl get` users see them."""
    servable = [a for a in o.adapters if not a.problem]
    loaded = len([a for a in servable if o.of(a.name).loaded])
    note = f"{n.ready}/{o.desired_replicas} replicas ready, {loaded}/{len(servable)} adapter(s) loaded"
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
        conditions=[condition(t, t in failing, "InvalidSpec", message, generation) for t in POOL_CONDITIONS],
    )


_ADAPTER_REASONS = {
    AdapterPhase.LOADING: "Accepted",
    AdapterPhase.READY: "Accepted",
    AdapterPhase.PENDING: "SourceUnreadable",
    AdapterPhase.CONFLICT: "NameConflict",
    AdapterPhase.FAILED: "Invalid",
}
# Ready=False reasons that mean "broken, a human must act": their Events are Warnings.
FAILED_REASONS = frozenset({"Invalid", "NameConflict", "LoadFailed"})


def adapter_reason(phase: AdapterPhase) -> str:
    """The CamelCase reason of a verdict (a LoRAAdapter's Accepted condition)."""
    return _ADAPTER_REASONS[phase]


def adapter_object_status(
    pool: str,
    generation: int | None,
    r: AdapterResult,
    p: Presence = NOWHERE,
    *,
    routable: bool = True,
    blocked: str = "",
    placed: int | None = None,
    no_room: str = "",
) -> LoRAAdapterStatus:
    """The status of one LoRAAdapter attached to ``pool``: Accepted (the verdict), Ready (an engine
    holds it and the router serves: a request for it succeeds), Degraded (a human must act).
    ``blocked``: why the pool serves nothing now (its plan's problems), so no engine will load it.
    ``no_room``: why placement put it on no replica (``unplaced_message``): it waits for a human too."""
    accepted = r.phase in (AdapterPhase.LOADING, AdapterPhase.READY)
    verdict = adapter_reason(r.phase)
    phase = served_phase(r, p)
    if not accepted and r.phase != AdapterPhase.PENDING:
        ready = condition(READY, False, verdict, r.message, generation)
    elif blocked and phase != AdapterPhase.READY:
        ready = condition(READY, False, "PoolNotServing", f"pool {pool} cannot be served: {blocked}", generation)
    elif phase == AdapterPhase.READY and routable:
        ready = condition(READY, True, "Loaded", f"loaded on {p.loaded} ready replica(s) of pool {pool}", generation)
    elif phase == AdapterPhase.READY:
        ready = condition(READY, False, "WaitingForRouter", f"pool {pool}'s router has no ready pod yet", generation)
    elif p.failed:
        ready = condition(READY, False, "LoadFailed", p.failure_message(), generation)
    elif no_room and accepted:
        ready = condition(READY, False, NO_ROOM, f"pool {pool}: {no_room}", generation)
    elif r.phase == AdapterPhase.PENDING:
        ready = condition(READY, False, verdict, r.message or "waiting for its adapter_config.json", generation)
    else:
        waiting = f"{p.loading} replica(s) loading it" if p.loading else "no ready replica reports it loaded yet"
        ready = condition(READY, False, "Loading", f"pool {pool}: {waiting}", generation)
    degraded_why = r.message if r.phase in (AdapterPhase.FAILED, AdapterPhase.CONFLICT) else ""
    degraded_reason = verdict
    if not degraded_why and r.phase == AdapterPhase.PENDING and r.message:
        degraded_why = r.message
    if not degraded_why and p.failures:
        degraded_why, degraded_reason = p.failure_message(), "LoadFailed"
    if not degraded_why and no_room and accepted and phase != AdapterPhase.READY:
        degraded_why, degraded_reason = f"pool {pool}: {no_room}", NO_ROOM
    return LoRAAdapterStatus(
        observed_generation=generation,
        pool=pool,
        rank=r.rank,
        placed_replicas=placed,
        phase=phase,
        loaded_replicas=p.loaded if accepted or r.phase == AdapterPhase.PENDING else None,
        resolved_revision=", ".join(p.revisions) or None,
        message=served_message(r, p),
        conditions=[
            condition(ACCEPTED, accepted, verdict, r.message or "source read; rank and base model valid", generation),
            ready,
            condition(
                DEGRADED, bool(degraded_why), degraded_reason if degraded_why else "Healthy", degraded_why, generation
            ),
        ],
    )


def unplaced_message(placement: Placement | None, adapter: str) -> str:
    """Why ``adapter`` is on no replica, or "" when it has one (or every replica holds everything)."""
    if placement is None or placement.holders is None or placement.holders.get(adapter):
        return ""
    st = placement.status  # no count of the others here: it would rewrite every unplaced adapter's status
    return (  # each time one more fits or not (the pool's status.placement counts them)
        f"placed on no replica: its {st.slots} replicas x maxCpuLoras {st.capacity} are full "
        f"({st.slots * st.capacity} adapters); raise spec.replicas or spec.lora.maxCpuLoras"
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
