"""Who holds each adapter: placement's step over the cluster (replica slots, each adapter's k, its
holders) from the pods, status and load, given as plain data. Pure.

Called by ``render.desired`` (``decide_placement``, ``observed_load``, ``previous_k``: for the
operator's ``controller.decide`` and for ``lorapool render``), by ``controller.reconcile``
(``assign_slots``, ``slot_patches``) and by the benchmark. The policy it applies is
``lorapool.plan.placement`` (rendezvous, ``place``, ``next_k``); here it meets the cluster:

- **Slots** are the stable replica identities placement hashes over: ``0 .. spec.replicas-1``,
  one per engine pod, kept in the pod's annotation ``lorapool.io/slot``. A pod keeps its slot
  for life; a new pod (a rollout's replacement, a scale-up) takes the smallest free one, so a
  rolling update hands the replacement the slot (and the share) of the pod it replaces and moves
  nothing. ``controller.kubernetes.io/pod-deletion-cost`` = -slot makes a scale-down remove the
  highest slot, the one placement drops. The sidecar reads its slot from a downward-API file.
- **k** per adapter: ``spec.placement`` (a number, an override, 'all') or, under 'auto', from its
  share of the requests the pool's routers counted (``api/requests.py``) and its load in the
  sidecars' reports (``next_k``: hysteresis), remembered across reconciles in
  ``status.adapters[].targetReplicas`` / ``targetChangedAt``.
- **Mode**: 'auto' keeps every adapter on every replica while the catalog fits one replica's
  CPU cache (``maxCpuLoras``): small pools behave as before placement existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lorapool.api.clock import unix
from lorapool.api.models import ALL, AUTO, LoRAPool
from lorapool.api.pods import POD_DELETION_COST_ANNOTATION, SLOT_ANNOTATION, EnginePod, RouterPod
from lorapool.api.status import PlacementMode, PlacementStatus
from lorapool.plan.placement import AdapterLoad, KState, ScalingRule, clip_k, next_k, place

# What the operator's 'auto' k reacts to, in the units the sidecars' reports give (api/report.py):
# ``waiting`` = the sum over replicas of the share of the window its requests waited for a slot
# (a lower bound of its mean queued requests), compared per holder; TTFT p99 of the replicas it
# kept busy (in flight at least half the window). Expansion is quick: once per report window
# measured after the last change (``observed_load`` passes the windows' timing); shrinking slow
# (spec.placement.scaleDownCooldownSeconds).
EXPAND_WAITING_PER_HOLDER = 0.5
SHRINK_WAITING_PER_HOLDER = 0.1
EXPAND_TTFT_P99_S = 2.0
SHRINK_TTFT_P99_S = 1.0
EXPAND_INTERVAL_S = 30.0  # only for a load without its windows' timing (reports always carry it)
# Expansions add at most this many copies per replica per step, pool-wide (``ScalingRule.max_new_copies``):
# each is a disk load that stalls a batch.
NEW_COPIES_PER_REPLICA = 1.0
BUSY_SHARE = 0.5  # a replica's TTFT counts for an adapter in flight there this share of the window
# k from the adapter's share of the routers' request counts (``ScalingRule``): no holder carries more than
# EXPAND_SHARE of a mean replica's requests for one adapter; a holder is given back only below SHRINK_SHARE.
# Measured in bench regime (e) (pilots, placement alone): 0.25 gave goodput 139 req/s and p99 TTFT 3.2 s,
# 0.5 gave 129 req/s and 3.5 s (a holder's share of a hot adapter adds to its own adapters' load).
EXPAND_SHARE = 0.25
SHRINK_SHARE = 0.125
MIN_FAIR_RPS = 2.0  # a pool under 2 req/s per replica is nearly idle: its shares are noise, f is floored here
# (so there an adapter needs over EXPAND_SHARE x 2 = 0.5 req/s per holder to get another one)
RATE_FRESH_WINDOWS = 2.0  # a router's window counts while it closed at most this many windows ago


# --- slots -----------------------------------------------------------------------------------

# A pod without a slot (beyond spec.replicas during a scale-down) goes before every slotted pod.
SURPLUS_DELETION_COST = str(-1_000_000)


@dataclass(frozen=True)
class PodSlot:
    """An engine pod as placement sees it."""

    name: str
    slot: int | None  # its annotation, None when absent or unreadable
    created: str  # creationTimestamp: older pods choose first
    terminating: bool
    deletion_cost: str | None = None


def pod_slots(pods: Sequence[EnginePod]) -> list[PodSlot]:
    return [PodSlot(p.name, p.slot, p.created, p.terminating, p.deletion_cost) for p in pods]


def assign_slots(pods: Sequence[PodSlot], replicas: int) -> dict[str, int | None]:
    """Pod -> slot. A live pod keeps a slot below ``replicas`` that no older pod holds; the rest take
    the smallest free slot, oldest pod first; terminating pods and pods beyond ``replicas`` get None."""
    live = sorted((p for p in pods if not p.terminating), key=lambda p: (p.created, p.name))
    taken: dict[int, str] = {}
    out: dict[str, int | None] = {p.name: None for p in pods}
    for p in live:
        if p.slot is not None and p.slot < replicas and p.slot not in taken:
            taken[p.slot] = p.name
            out[p.name] = p.slot
    free = iter(sorted(set(range(replicas)) - set(taken)))
    for p in live:
        if out[p.name] is None:
            out[p.name] = next(free, None)
    return out


def slot_patches(pods: Sequence[PodSlot], assigned: Mapping[str, int | None]) -> dict[str, dict[str, str | None]]:
    """Pod -> the annotations to merge-patch (None removes one), for pods whose slot or cost is stale."""
    patches: dict[str, dict[str, str | None]] = {}
    for p in pods:
        if p.terminating:
            continue
        slot = assigned.get(p.name)
        cost = SURPLUS_DELETION_COST if slot is None else str(-slot)
        if p.slot != slot or p.deletion_cost != cost:
            patches[p.name] = {
                SLOT_ANNOTATION: None if slot is None else str(slot),
                POD_DELETION_COST_ANNOTATION: cost,
            }
    return patches


# --- load and memory -------------------------------------------------------------------------


def request_rates(routers: Sequence[RouterPod], now: float) -> tuple[dict[str, float], float] | None:
    """Each adapter's request rate and the pool's, summed over the router pods' fresh windows
    (``lorapool.io/requests``); None when no router pod has one (none yet, an old router).

    Fresh: closed at most ``RATE_FRESH_WINDOWS`` windows before ``now`` (Unix seconds); a stale
    window (a router that stopped writing) counts as none. Pods being deleted are skipped.
    """
    rates: dict[str, float] = {}
    total, seen = 0.0, False
    for pod in routers:
        if pod.terminating:
            continue
        w = pod.requests
        if w is None or now - w.end > RATE_FRESH_WINDOWS * w.window_s:
            continue
        seen = True
        total += w.total / w.window_s
        for name in w.counts:
            rates[name] = rates.get(name, 0.0) + w.rate(name)
    return (rates, total) if seen else None


def observed_load(
    pods: Sequence[EnginePod], routers: Sequence[RouterPod] = (), now: float = 0.0
) -> dict[str, AdapterLoad]:
    """Each adapter's load over the last window, summed over the live pods' reports, with its request
    rate and the pool's from the router pods' fresh windows (``request_rates``; ``now`` in Unix seconds).

    Without a fresh router window ``pool_requests_per_s`` is None and ``requests_per_s`` 0: ``next_k``
    then sizes k from TTFT and queues alone. ``window_s`` / ``measured_until_s``: the longest window
    and the oldest window end among the engine reports that saw the adapter (how fresh its load is:
    ``next_k``'s TTFT/queue rule expands again only on a window measured after its last change).
    """
    rated = request_rates(routers, now)
    rates, total = rated if rated is not None else ({}, None)
    waiting: dict[str, float] = {}
    ttft: dict[str, float] = {}
    window: dict[str, float] = {}
    until: dict[str, float] = {}
    busy: dict[str, float] = {}
    for pod in pods:
        if pod.terminating:
            continue
        obs = pod.report.observations if pod.report else None
        if obs is None or obs.window_s <= 0:
            continue
        for name, load in obs.adapters.items():
            waiting[name] = waiting.get(name, 0.0) + load.waiting_s / obs.window_s
            window[name] = max(window.get(name, 0.0), obs.window_s)
            busy[name] = busy.get(name, 0.0) + min(load.inflight_s / obs.window_s, 1.0)
            until[name] = min(until.get(name, obs.end), obs.end)
            if obs.ttft_p99_s is not None and load.inflight_s >= BUSY_SHARE * obs.window_s:
                ttft[name] = max(ttft.get(name, 0.0), obs.ttft_p99_s)
    return {
        n: AdapterLoad(
            requests_per_s=round(rates.get(n, 0.0), 6),
            waiting=waiting.get(n, 0.0),
            ttft_p99_s=ttft.get(n),
            window_s=window.get(n, 0.0),
            measured_until_s=until.get(n),
            busy=round(busy.get(n, 0.0), 3),
            pool_requests_per_s=None if total is None else round(total, 6),
        )
        for n in sorted(set(waiting) | set(rates))
    }


def _epoch(text: str) -> float | None:
    try:
        return unix(text)
    except ValueError:
        return None


def previous_k(status: Mapping[str, Any] | None) -> dict[str, KState]:
    """The k each adapter had, from the pool's last status (what survives an operator restart)."""
    out: dict[str, KState] = {}
    for a in (status or {}).get("adapters") or []:
        k, since = a.get("targetReplicas"), a.get("targetChangedAt")
        if isinstance(k, int) and k >= 1 and isinstance(since, str) and (at := _epoch(since)) is not None:
            out[str(a.get("name"))] = KState(k, at)
    return out


# --- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where every adapter lives this reconcile, and what status says about it."""

    status: PlacementStatus
    holders: Mapping[str, tuple[int, ...]] | None  # None: every replica holds every adapter
    k: Mapping[str, KState] = field(default_factory=dict)  # k and since when, per adapter

    def placed(self, adapter: str, replicas: int) -> int:
        return replicas if self.holders is None else len(self.holders.get(adapter, ()))


def scaling_rule(pool: LoRAPool) -> ScalingRule:
    spec, n = pool.spec.placement, max(pool.spec.replicas, 1)
    k_max = max(min(spec.max_replicas or n, n), 1)
    return ScalingRule(
        expand_waiting=EXPAND_WAITING_PER_HOLDER,
        shrink_waiting=SHRINK_WAITING_PER_HOLDER,
        expand_ttft_p99_s=EXPAND_TTFT_P99_S,
        shrink_ttft_p99_s=SHRINK_TTFT_P99_S,
        expand_interval_s=EXPAND_INTERVAL_S,
        cooldown_s=float(spec.scale_down_cooldown_seconds),
        k_min=min(spec.min_replicas, k_max),
        k_max=k_max,
        max_new_copies=max(1, round(NEW_COPIES_PER_REPLICA * n)),
        pool_replicas=n,
        expand_share=EXPAND_SHARE,
        shrink_share=SHRINK_SHARE,
        min_fair_rps=MIN_FAIR_RPS,
    )


def decide_placement(
    pool: LoRAPool,
    adapters: Sequence[str],
    capacity: int,
    previous: Mapping[str, KState],
    load: Mapping[str, AdapterLoad],
    now: float,
) -> Placement:
    """Mode, k and holders for the pool's servable ``adapters`` over slots 0..replicas-1.

    ``capacity`` is the plan's maxCpuLoras: a replica is never told to hold more.
    """
    spec, n = pool.spec.placement, pool.spec.replicas
    overrides = {o.name: o.replicas for o in spec.overrides if o.name in set(adapters)}
    unknown = sorted(o.name for o in spec.overrides if o.name not in set(adapters))
    fewer = any(v != ALL for v in overrides.values())
    note = f"; overrides name no adapter of this pool: {', '.join(unknown)}" if unknown else ""
    if n == 0 or (spec.replicas_per_adapter == AUTO and len(adapters) <= capacity and not fewer):
        why = (
            "no replicas"
            if n == 0
            else f"auto: the {len(adapters)} adapters fit each replica's CPU cache (maxCpuLoras {capacity}), "
            "so every replica holds every adapter"
        )
        return Placement(
            PlacementStatus(mode=PlacementMode.ALL_REPLICAS, reason=why + note, slots=n, capacity=capacity), None
        )
    if spec.replicas_per_adapter == AUTO:
        rule, mine = scaling_rule(pool), set(adapters)
        stepped = next_k(
            {a: s for a, s in previous.items() if a in mine}, {a: x for a, x in load.items() if a in mine}, now, rule
        )
        k = {a: stepped.get(a, KState(rule.k_min, now)) for a in adapters}
        why = (
            f"auto: {len(adapters)} adapters exceed one replica's CPU cache (maxCpuLoras {capacity}): each adapter "
            f"on k of {n} replicas, k from its load within {rule.k_min}..{rule.k_max}"
        )
    else:
        fixed = int(spec.replicas_per_adapter)
        k = {a: _kept(previous.get(a), fixed, now) for a in adapters}
        why = f"replicasPerAdapter {fixed}: each adapter on {clip_k(fixed, n)} of {n} replicas"
    for a, v in overrides.items():
        k[a] = _kept(previous.get(a), n if v == ALL else int(v), now)
    holders = place({a: s.k for a, s in k.items()}, [str(i) for i in range(n)], capacity)
    unplaced = sorted(a for a, h in holders.items() if not h)
    if unplaced:
        why += (
            f"; {len(unplaced)} adapters fit on no replica ({n} replicas x maxCpuLoras {capacity}): raise "
            "spec.replicas or spec.lora.maxCpuLoras"
        )
    status = PlacementStatus(
        mode=PlacementMode.K_OF_N, reason=why + note, slots=n, capacity=capacity, unplaced=len(unplaced)
    )
    return Placement(status, {a: tuple(sorted(int(r) for r in h)) for a, h in holders.items()}, k)


def _kept(previous: KState | None, k: int, now: float) -> KState:
    """A fixed k, keeping its timestamp while it does not change."""
    return previous if previous is not None and previous.k == k else KState(k, now)
