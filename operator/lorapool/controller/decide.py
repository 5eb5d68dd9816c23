"""The reconcile's decisions, free of I/O. Pure: no kopf, kubernetes or asyncio.

``controller.reconcile`` reads the world and hands it here in plain data; every choice
(which adapters are valid, what each one's verdict is, the plan, the objects to apply,
what the observed children mean, which Events to post) is a function of that data, so
it is tested with tables and no control plane. The steps, in reconcile order:

    read_pool -> pool_adapters -> judge_adapter (per adapter) -> decide -> observe (presence) -> events
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from lorapool.api.fields import AUTO
from lorapool.api.load import describe
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.api.peft import parse_adapter_config, same_base_model
from lorapool.api.pods import EnginePod, RouterPod
from lorapool.api.sizing import ReplanPolicy
from lorapool.api.status import AdapterPhase, Condition, ConditionType, LoRAAdapterStatus
from lorapool.controller import replan
from lorapool.controller.books import shared_books_observed
from lorapool.controller.gateway import GatewayObserved
from lorapool.controller.status import (
    CONVERGING_REASONS,
    FAILED_REASONS,
    AdapterResult,
    Observed,
    Presence,
    RouterPolicyObserved,
)
from lorapool.errors import LoRAPoolError, PlanError
from lorapool.plan.adapters import Merged, PoolAdapter
from lorapool.plan.gpus import GPUS
from lorapool.plan.holders import Placement
from lorapool.plan.planner import AdapterRank, Plan, plan_pool
from lorapool.render import names
from lorapool.render.desired import Desired, desired_state
from lorapool.render.manifests import RenderOptions, router_policy

Obj = dict[str, Any]
PLAN_FLAGS = ("maxLoras", "maxLoraRank", "maxCpuLoras")  # a change of any of these rolls the engine pods


# --- 1. load ---------------------------------------------------------------------------------


def read_pool(body: Mapping[str, Any]) -> LoRAPool | list[str]:
    """The pool, or one ``path: problem`` line per thing its spec gets wrong."""
    try:
        return LoRAPool.model_validate(body)
    except ValidationError as exc:
        return describe(exc)


def generation(body: Mapping[str, Any]) -> int | None:
    generation: int | None = body["metadata"].get("generation")
    return generation


# --- 2. read adapters ------------------------------------------------------------------------


def points_at(body: Mapping[str, Any], pool: str) -> bool:
    """True when a LoRAAdapter object's spec.poolRef names ``pool`` (read before validation)."""
    return bool((body.get("spec") or {}).get("poolRef", {}).get("name") == pool)


@dataclass(frozen=True)
class AdapterObjects:
    """The LoRAAdapter objects that point at one pool."""

    valid: tuple[LoRAAdapter, ...]
    invalid: tuple[tuple[str, str], ...]  # (name, problems) of those the models refuse


def pool_adapters(bodies: Sequence[Mapping[str, Any]], pool: str) -> AdapterObjects:
    valid: list[LoRAAdapter] = []
    invalid: list[tuple[str, str]] = []
    for raw in bodies:
        if not points_at(raw, pool):
            continue
        try:
            valid.append(LoRAAdapter.model_validate(raw))
        except ValidationError as exc:
            invalid.append((raw["metadata"]["name"], "; ".join(describe(exc))))
    return AdapterObjects(tuple(valid), tuple(invalid))


@dataclass(frozen=True)
class Fetched:
    """What reading one adapter's ``adapter_config.json`` gave: the parsed JSON, or why there is none."""

    config: Any = None  # the JSON as read; parse_adapter_config judges its shape
    unreadable: str | None = None  # the source could not be read (down, timed out): maybe later
    refused: str | None = None  # reading it showed the adapter itself is wrong


def judge_adapter(adapter: PoolAdapter, base_model: str, fetched: Fetched) -> AdapterResult:
    """Rank and verdict for one adapter from its adapter_config.json, falling back to the spec's rank."""
    spec = adapter.spec

    def result(phase: AdapterPhase, rank: int | None, message: str = "") -> AdapterResult:
        return AdapterResult(spec.name, adapter.origin, rank, phase, message)

    if fetched.refused is not None:
        return result(AdapterPhase.FAILED, spec.rank, fetched.refused)
    if fetched.unreadable is not None:
        reason = fetched.unreadable
        if spec.rank is not None:
            message = f"source not readable by the operator ({reason}); using rank {spec.rank} from the spec"
            return result(AdapterPhase.LOADING, spec.rank, message)
        return result(
            AdapterPhase.PENDING,
            None,
            f"cannot read adapter_config.json to learn its rank: {reason}; fix the source or set {adapter.field}.rank",
        )
    try:
        config = parse_adapter_config(fetched.config, where=f"{spec.name}: adapter_config.json")
    except LoRAPoolError as exc:
        return result(AdapterPhase.FAILED, spec.rank, str(exc))
    if config.problems:
        return result(AdapterPhase.FAILED, config.rank, "; ".join(config.problems))
    if not same_base_model(base_model, config.base_model):
        return result(
            AdapterPhase.FAILED,
            config.rank,
            f"trained on {config.base_model!r}, but the pool serves {base_model!r}; "
            "attach it to a pool with that base model",
        )
    if spec.rank is not None and spec.rank != config.rank:
        return result(
            AdapterPhase.FAILED,
            config.rank,
            f"{adapter.field}.rank={spec.rank} but adapter_config.json says {config.rank}; "
            "fix or remove the rank in the spec",
        )
    return result(AdapterPhase.LOADING, config.rank)


def missing_pool(namespace: str, pool: str, adapter: str) -> AdapterResult:
    """The verdict on a LoRAAdapter whose spec.poolRef names a pool that does not exist."""
    message = (
        f"spec.poolRef.name: no LoRAPool {pool} in namespace {namespace}; create it, or set spec.poolRef.name "
        "to an existing pool (kubectl get lorapools)"
    )
    return AdapterResult(adapter, "LoRAAdapter", None, AdapterPhase.FAILED, message)


def unmerged(merged: Merged, invalid: Sequence[tuple[str, str]]) -> list[AdapterResult]:
    """Verdicts of the LoRAAdapters the pool does not serve: name clashes, then refused specs."""
    return [
        *(AdapterResult(n, "LoRAAdapter", None, AdapterPhase.CONFLICT, m) for n, m in merged.conflicts),
        *(AdapterResult(n, "LoRAAdapter", None, AdapterPhase.FAILED, m) for n, m in invalid),
    ]


# --- 3. decide -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What this reconcile wants: the plan (or why there is none), every adapter's verdict, the children."""

    plan: Plan | None
    plan_errors: tuple[str, ...]
    adapters: tuple[AdapterResult, ...]  # the pool's adapters (spec order), then unmerged LoRAAdapters
    objects: tuple[Obj, ...]  # children to server-side apply, in order; none while the plan is invalid
    identities: Mapping[str, str] = field(default_factory=dict)  # rendered adapter -> identity the sidecars load
    placement: Placement | None = None  # where each adapter lives; None while the plan is invalid
    routers: tuple[RouterPod, ...] = ()  # the router pods as read before the apply (their policy state)
    # EngineRestartPending (controller.replan), the Event announcing a newly pending restart, and when to
    # run again (a settle window's end); None without a plan
    restart: Condition | None = None
    restart_event: Event | None = None
    after_s: float | None = None


def decide(
    pool: LoRAPool,
    merged: Merged,
    verdicts: Sequence[AdapterResult],
    invalid: Sequence[tuple[str, str]],
    options: RenderOptions,
    *,
    pods: Sequence[EnginePod] = (),
    routers: Sequence[RouterPod] = (),
    status: Mapping[str, Any] | None = None,
    now: float = 0.0,
    tuned: int | None = None,
    engine: Mapping[str, Any] | None = None,
    changed_at: float | None = None,
) -> Decision:
    """Plan over the adapters not refused, place them, render the children (``render.desired``).

    ``verdicts`` are ``judge_adapter`` results in ``merged.adapters`` order. Every rank the
    planner sees either fits its max-lora-rank or makes the plan fail naming the adapter, so
    an adapter that reaches the rendered set always loads. ``pods`` (the engine pods, with their
    sidecars' reports: ``lorapool.api.pods.engine_pods``), ``routers`` (the router pods, with their request counts: ``router_pods``), the pool's last
    ``status`` and ``now`` (Unix seconds) feed placement.
    ``tuned``: the --max-loras the sizing loop applies (``controller.tuning.tuned_max_loras``).
    ``engine`` (as read before the apply) and ``changed_at`` (``replan.catalogue_seen``): may a plan change
    restart the engines now (``controller.replan``); held, the template keeps the running flags.
    """
    results = list(verdicts)
    servable = [(a, v.rank) for a, v in zip(merged.adapters, results, strict=True) if v.phase != AdapterPhase.FAILED]
    r, fresh = _replan(pool, servable, status, engine, changed_at, now, tuned)

    def render(p: LoRAPool, adapters: Sequence[tuple[PoolAdapter, int | None]], t: int | None) -> Desired:
        return desired_state(p, adapters, options, pods=pods, routers=routers, status=status, now=now, tuned=t)

    running = r.running if r is not None and r.held else None
    if r is None or fresh is None or running is None:
        want = render(pool, servable, tuned)
    else:  # held: the running flags, and the adapters they can load
        want = _kept(
            render(_pinned(pool, running), _fits_rank(merged.adapters, results, running.max_lora_rank), None), fresh, r
        )
        if want.plan is None:  # the running flags no longer plan (the spec changed under them): apply
            r, want = replace(r, action=replan.Action.APPLY), render(pool, servable, tuned)
        else:
            results = _waiting_for_rank(results, running.max_lora_rank, r.wanted.max_lora_rank)
    first = r is not None and r.action == replan.Action.FIRST  # no engine template until the catalogue settles
    objects = tuple(o for o in want.objects if not (first and _is_engine(o, pool)))
    adapters = (*results, *unmerged(merged, invalid))
    restart, event = _restart_report(pool, r, fresh, status)
    return Decision(
        want.plan,
        want.plan_errors,
        adapters,
        objects,
        want.identities,
        want.placement,
        tuple(routers),
        restart,
        event,
        r.after_s if r is not None else None,
    )


# --- 3b. replan: may a plan change restart the engines now (controller.replan) ------------------


def _replan(
    pool: LoRAPool,
    servable: Sequence[tuple[PoolAdapter, int | None]],
    status: Mapping[str, Any] | None,
    engine: Mapping[str, Any] | None,
    changed_at: float | None,
    now: float,
    tuned: int | None,
) -> tuple[replan.Replan | None, Plan | None]:
    """The replan verdict and the plan the catalogue asks for; (None, None) while it does not plan
    (``desired_state`` reports the PlanError as today)."""
    try:
        fresh = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, rank) for a, rank in servable], tuned=tuned)
    except PlanError:
        return None, None
    lora = pool.spec.lora
    tuning_applies = tuned is not None and lora.tuning is not None and lora.tuning.apply
    inputs = replan.Inputs(
        running=replan.engine_flags(engine),
        wanted=replan.Flags(fresh.max_loras, fresh.max_lora_rank, fresh.max_cpu_loras),
        auto=lora.max_loras == AUTO and lora.max_cpu_loras == AUTO and not tuning_applies,
        changed_at=changed_at,
        now=now,
        settle_s=float(lora.replan.settle_seconds),
        approval=lora.replan.policy == ReplanPolicy.APPROVAL,
        approved=((pool.metadata.annotations or {}).get(replan.APPROVE_ANNOTATION) or "").strip() or None,
        announced=replan.announced_hash(status),
    )
    return replan.decide_replan(inputs), fresh


def _pinned(pool: LoRAPool, flags: replan.Flags) -> LoRAPool:
    """The pool with the running engines' flags written in as explicit values (no sizing loop), so the
    one render path (``render.desired``) renders the template they run: an unchanged config hash."""
    lora = pool.spec.lora.model_copy(
        update={
            "max_loras": flags.max_loras,
            "max_lora_rank": flags.max_lora_rank,
            "max_cpu_loras": flags.max_cpu_loras,
            "tuning": None,
        }
    )
    return pool.model_copy(update={"spec": pool.spec.model_copy(update={"lora": lora})})


def _fits_rank(
    adapters: Sequence[PoolAdapter], results: Sequence[AdapterResult], rank: int
) -> list[tuple[PoolAdapter, int | None]]:
    """The servable adapters the running --max-lora-rank can load (the others wait for the restart)."""
    return [
        (a, v.rank)
        for a, v in zip(adapters, results, strict=True)
        if v.phase != AdapterPhase.FAILED and (v.rank is None or v.rank <= rank)
    ]


def _waiting_for_rank(results: Sequence[AdapterResult], running: int, wanted: int) -> list[AdapterResult]:
    """Adapters above the running --max-lora-rank: Pending, saying they wait for the engine restart."""
    message = (
        f"needs --max-lora-rank {wanted}, the engines run {running}: waits for the engine restart "
        f"(condition {replan.CONDITION} on the pool)"
    )
    return [
        replace(v, phase=AdapterPhase.PENDING, message=message)
        if v.phase != AdapterPhase.FAILED and v.rank is not None and v.rank > running
        else v
        for v in results
    ]


def _kept(want: Desired, fresh: Plan, r: replan.Replan) -> Desired:
    """The pinned render with honest reasons: each flag kept from the running engines says so and why."""
    if want.plan is None or r.running is None:
        return want
    kept = {
        "maxLoras": (r.running.max_loras, fresh.max_loras),
        "maxLoraRank": (r.running.max_lora_rank, fresh.max_lora_rank),
        "maxCpuLoras": (r.running.max_cpu_loras, fresh.max_cpu_loras),
    }
    why = (
        "within the band not worth a restart (grows past x1.25, shrinks to half or less)"
        if r.action == replan.Action.KEEP
        else f"a restart is pending ({replan.CONDITION}: {r.action.value})"
    )
    reasons = {
        flag: fresh.reasons[flag]
        if old == new
        else f"{old}: kept from the running engines, {why}; the plan wants {new}"
        for flag, (old, new) in kept.items()
    }
    return replace(want, plan=replace(want.plan, reasons=reasons, warnings=fresh.warnings))


def _is_engine(obj: Obj, pool: LoRAPool) -> bool:
    return bool(obj.get("kind") == "Deployment" and obj["metadata"]["name"] == names.engine(pool.metadata.name))


def _restart_report(
    pool: LoRAPool, r: replan.Replan | None, fresh: Plan | None, status: Mapping[str, Any] | None
) -> tuple[Condition | None, Event | None]:
    """EngineRestartPending and, when a restart is newly pending, the Event that announces it."""
    if r is None or fresh is None:
        return None, None
    changed = [
        f"{flag} {fresh.reasons[flag]}"
        for flag, old, new in (
            ("maxLoras", r.running.max_loras if r.running else None, r.wanted.max_loras),
            ("maxLoraRank", r.running.max_lora_rank if r.running else None, r.wanted.max_lora_rank),
            ("maxCpuLoras", r.running.max_cpu_loras if r.running else None, r.wanted.max_cpu_loras),
        )
        if old != new and r.running is not None
    ]
    settle = float(pool.spec.lora.replan.settle_seconds)
    cond = replan.condition(r, pool.metadata.name, settle, pool.metadata.generation, "; ".join(changed))
    announced = replan.announcement(r, status)
    return cond, Event(announced[0], cond.message, announced[1]) if announced else None


# --- 5. observe ------------------------------------------------------------------------------


def unschedulable(pool: LoRAPool, pods: Sequence[EnginePod]) -> str | None:
    """Why the first unschedulable engine pod cannot be placed, and what would place it."""
    for pod in pods:
        if (message := pod.unschedulable) is not None:
            gpu = pool.spec.gpu
            wanted = ", ".join(GPUS[gpu.product].node_products)
            return (
                f"engine pod {pod.name} cannot be scheduled: {message}; it needs "
                f"a node labelled nvidia.com/gpu.product in [{wanted}] with {gpu.count} free nvidia.com/gpu: "
                "add such nodes or change spec.gpu"
            )
    return None


def presence(identities: Mapping[str, str], pods: Sequence[EnginePod]) -> dict[str, Presence]:
    """What the engines hold of each desired adapter, from their sidecars' reports (lorapool.api.report).

    Loaded counts only serving pods (Ready, not terminating) holding the identity the spec asks for
    now; failures and loads in progress count on every pod that is not terminating.
    """
    loaded = dict.fromkeys(identities, 0)
    loading = dict.fromkeys(identities, 0)
    failures: dict[str, list[str]] = {name: [] for name in identities}
    revisions: dict[str, set[str]] = {name: set() for name in identities}
    for pod in sorted(pods, key=lambda p: p.name):
        report = pod.report
        if report is None or pod.terminating:
            continue
        for name, identity in identities.items():
            if report.holds(name, identity):
                loaded[name] += pod.serving
                if pod.serving and (revision := report.adapters[name].revision):
                    revisions[name].add(revision)
            elif (why := report.failure(name, identity)) is not None:
                failures[name].append(f"{pod.name or '?'}: {why}")
            elif report.loading(name):
                loading[name] += 1
    return {n: Presence(loaded[n], loading[n], tuple(failures[n]), tuple(sorted(revisions[n]))) for n in identities}


def engine_versions(pods: Sequence[EnginePod]) -> dict[str | None, int]:
    """vLLM version -> serving engine pods whose sidecar reports it (None: it read no version)."""
    counts: dict[str | None, int] = {}
    for pod in pods:
        if pod.report is not None and pod.serving:
            counts[pod.report.engine_version] = counts.get(pod.report.engine_version, 0) + 1
    return counts


def observe(
    pool: LoRAPool,
    body: Mapping[str, Any],
    decision: Decision,
    engine: Mapping[str, Any] | None,
    router: Mapping[str, Any] | None,
    pods: Sequence[EnginePod],
    gateway: GatewayObserved | None = None,
) -> Observed:
    """What the pool's status is computed from: the decision plus the children as the API server has them."""
    name, namespace = pool.metadata.name, pool.metadata.namespace
    engine_status = (engine or {}).get("status") or {}
    router_status = (router or {}).get("status") or {}
    return Observed(
        generation=generation(body),
        plan=decision.plan.to_status() if decision.plan else None,
        plan_errors=decision.plan_errors,
        adapters=decision.adapters,
        desired_replicas=pool.spec.replicas,
        engine=engine_status if engine else None,
        engine_generation_current=bool(engine)
        and engine_status.get("observedGeneration", 0) >= (engine or {})["metadata"].get("generation", 0),
        router_ready=bool(router) and int(router_status.get("readyReplicas") or 0) > 0,
        unschedulable=unschedulable(pool, pods),
        endpoint=names.endpoint(name, namespace) if pool.spec.router.http else "",
        selector=names.selector_string(name, "engine"),
        presence=presence(decision.identities, pods),
        placement=decision.placement,
        gateway=gateway,
        engine_versions=engine_versions(pods),
        router_policy=router_policy_observed(pool, decision.routers, decision.plan),
        shared_books=shared_books_observed(pool, decision.routers),
    )


def router_policy_observed(
    pool: LoRAPool, routers: Sequence[RouterPod], plan: Plan | None = None
) -> RouterPolicyObserved:
    """The routers' policy state beside the document rendered now (``render.configmaps.router_policy``,
    with ``plan``'s slots).

    The router pods are the ones read before the apply (``decide``'s ``routers``): a router that just
    refused an edit shows at the next reconcile or resync, as its request counts do."""
    live = tuple((r.name, r.policy) for r in routers if not r.terminating)
    return RouterPolicyObserved(router_policy(pool, plan).hash, live)


# --- 6. report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """A core/v1 Event to post on the object: reason, message, Normal or Warning."""

    reason: str
    message: str
    type: str = "Normal"


def pool_events(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """Events on transitions a human cares about: readiness and vLLM flag changes (wire-form statuses)."""

    def ready(s: Mapping[str, Any]) -> Mapping[str, Any]:
        return next((c for c in s.get("conditions") or [] if c.get("type") == ConditionType.READY), {})

    events: list[Event] = []
    before, after = ready(old), ready(new)
    if before.get("status") != after.get("status") or before.get("reason") != after.get("reason"):
        normal = after.get("status") == "True" or after.get("reason") in CONVERGING_REASONS
        events.append(
            Event(after.get("reason", "Unknown"), after.get("message", ""), "Normal" if normal else "Warning")
        )
    old_phases = {a.get("name"): a.get("phase") for a in old.get("adapters") or []}
    for adapter in new.get("adapters") or []:
        if adapter.get("phase") == AdapterPhase.FAILED and old_phases.get(adapter.get("name")) != AdapterPhase.FAILED:
            message = f"adapter {adapter.get('name')}: {adapter.get('message', '')}"
            events.append(Event("AdapterFailed", message, "Warning"))
    old_plan, new_plan = old.get("plan") or {}, new.get("plan") or {}
    if new_plan and any(old_plan.get(f) != new_plan.get(f) for f in PLAN_FLAGS):
        message = ", ".join(f"{f}={new_plan[f]}" for f in PLAN_FLAGS)
        events.append(Event("PlanChanged", f"vLLM flags: {message}"))
    return events


def adapter_events(old: Mapping[str, Any], new: LoRAAdapterStatus) -> list[Event]:
    """On a change of the Ready condition's reason: a Warning when the adapter is refused or every
    replica failed to load it (with the engine's reason), a Normal Event when it became loaded."""

    def ready(conditions: Any) -> Mapping[str, Any]:
        return next((c for c in conditions or [] if c.get("type") == ConditionType.READY), {})

    before = ready(old.get("conditions"))
    after = ready([c.to_wire() for c in new.conditions])
    if before.get("reason") == after.get("reason") and before.get("status") == after.get("status"):
        return []
    if after.get("reason") in FAILED_REASONS:
        return [Event(after["reason"], after.get("message", ""), "Warning")]
    if after.get("status") == "True":
        return [Event(after.get("reason", "Loaded"), after.get("message", ""))]
    return []
