"""k-of-N placement: which replicas hold which adapter, and how many replicas each adapter gets. Pure.

Called by the operator's placement step (``plan.holders``) and by the benchmark's
``lorapool placement`` system, so both run the same code. No I/O, no clock: the caller
passes ``now``.

Three decisions, one function each:

- ``rendezvous``: the replicas in highest-random-weight order for one adapter. The weight
  is a stable hash (blake2b) of (adapter, replica identity), so every process and every
  release agrees, and adding or removing one replica only moves the adapters whose top-k
  contained it: ~k/N of them.
- ``place``: adapter -> its k holders, never more than ``capacity`` adapters on a replica
  (a replica's ``--max-cpu-loras``: past it vLLM's CPU cache evicts and reloads from disk,
  which is the cost placement exists to avoid).
- ``next_k``: each adapter's k from its measured load, with asymmetric hysteresis: expand fast,
  straight to the holders its share of the pool's requests needs when the routers measured its
  rate, and (the second trigger, the only one without a rate) as soon as a window measured after
  the last change says its queue or TTFT is over the threshold, by a step sized by how far over;
  shrink slow (one step after a long cooldown and only when the load per holder after the shrink
  stays below the lower thresholds): no flapping.

Replica identities are slot indices or StatefulSet ordinals ("0", "1", ...), never pod
names: a rolling update keeps identities, so it moves nothing.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

UNPLACED: tuple[str, ...] = ()
SPILL_MARGIN = 4  # rendezvous positions ranked beyond k up front; a longer spill ranks the rest


def _keys(adapter: str, replicas: Iterable[tuple[str, bytes]]) -> list[tuple[int, str]]:
    """(-weight, replica) per replica: the weight is 64 bits of blake2b(adapter NUL replica), identical
    in every process; negated so that an ascending sort puts the highest weight first (ties by name)."""
    base = hashlib.blake2b(adapter.encode() + b"\x00", digest_size=8)
    keys = []
    for replica, encoded in replicas:
        h = base.copy()  # the adapter's prefix hashed once, not once per replica
        h.update(encoded)
        keys.append((-int.from_bytes(h.digest(), "big"), replica))
    return keys


def _encoded(replicas: Sequence[str]) -> list[tuple[str, bytes]]:
    return [(r, r.encode()) for r in dict.fromkeys(replicas)]


def rendezvous(adapter: str, replicas: Sequence[str]) -> list[str]:
    """``replicas`` (duplicates dropped) by highest random weight for ``adapter``, highest first."""
    return [r for _, r in sorted(_keys(adapter, _encoded(replicas)))]


def clip_k(k: int, replicas: int) -> int:
    """k within [1, replicas] (0 when there are no replicas)."""
    return max(1, min(k, replicas)) if replicas else 0


def place(k_by_adapter: Mapping[str, int], replicas: Sequence[str], capacity: int) -> dict[str, tuple[str, ...]]:
    """Adapter -> the replicas that hold it, in the adapter's rendezvous order. Deterministic.

    Each adapter gets ``clip_k(k)`` holders: the first replicas of its rendezvous order that
    still have room (at most ``capacity`` adapters per replica). With room everywhere this is
    plain rendezvous hashing (top-k), so scaling by one replica moves ~k/N of the copies.

    When capacity is short, what gives way, in this order:
    1. First copies come before extra copies: every adapter is placed once before any adapter
       gets a second holder (coverage before spread). A full replica is skipped and the copy
       goes to the adapter's next replica in rendezvous order.
    2. Extra copies are handed out one round at a time (second copies, then third, ...);
       an extra copy that finds no replica with room is dropped: the adapter gets fewer than k.
    3. An adapter that finds no room even for its first copy (more adapters than
       ``len(replicas) * capacity``) maps to ``UNPLACED`` (an empty tuple).
    Within a round, adapters with a larger k go first (they carry more load), ties by name.
    """
    encoded = _encoded(replicas)
    if capacity < 0:
        raise ValueError(f"capacity={capacity} must be >= 0 (a replica's --max-cpu-loras)")
    want = {a: clip_k(k, len(encoded)) for a, k in k_by_adapter.items()}
    order = sorted(want, key=lambda a: (-want[a], a))
    keys = {a: _keys(a, encoded) for a in order}
    # Only the first few of each order are usually read: rank those, the rest when a spill needs it.
    ranked = {a: [r for _, r in heapq.nsmallest(want[a] + SPILL_MARGIN, keys[a])] for a in order}
    load = {r: 0 for r, _ in encoded}
    held: dict[str, list[str]] = {a: [] for a in order}
    cursor = dict.fromkeys(order, 0)  # next rendezvous position to try, per adapter
    for copy in range(max(want.values(), default=0)):
        for adapter in order:
            if want[adapter] <= copy or len(held[adapter]) < copy:
                continue  # wants no more copies, or an earlier copy already found no room
            candidates = ranked[adapter]
            while True:
                if cursor[adapter] == len(candidates) < len(encoded):
                    candidates = ranked[adapter] = [r for _, r in sorted(keys[adapter])]
                if cursor[adapter] == len(candidates) or load[candidates[cursor[adapter]]] < capacity:
                    break
                cursor[adapter] += 1
            if cursor[adapter] == len(candidates):
                continue
            chosen = candidates[cursor[adapter]]
            cursor[adapter] += 1
            held[adapter].append(chosen)
            load[chosen] += 1
    return {a: tuple(held[a]) for a in sorted(held)}


def shares(placement: Mapping[str, Sequence[str]], replicas: Iterable[str] = ()) -> dict[str, tuple[str, ...]]:
    """Replica -> the adapters it holds (sorted): what each replica's sidecar is told to load.

    ``replicas`` lists identities that get an entry even when they hold nothing.
    """
    out: dict[str, list[str]] = {r: [] for r in replicas}
    for adapter, holders in placement.items():
        for replica in holders:
            out.setdefault(replica, []).append(adapter)
    return {r: tuple(sorted(a)) for r, a in sorted(out.items())}


def moves(before: Mapping[str, Sequence[Hashable]], after: Mapping[str, Sequence[Hashable]]) -> int:
    """Adapter copies ``after`` places on a replica that did not hold them ``before``: the loads it costs."""
    return sum(len(set(holders) - set(before.get(adapter, ()))) for adapter, holders in after.items())


@dataclass(frozen=True)
class AdapterLoad:
    """One adapter's load over the last window, pool-wide.

    ``requests_per_s`` is its request rate and ``pool_requests_per_s`` the whole pool's, over the
    same windows (the routers count them); ``pool_requests_per_s`` None means no rate was measured
    (no router window yet, an old router), and then ``requests_per_s`` is not read.
    ``waiting`` is the mean number of its requests queued (router hold queue plus engine
    waiting) across all replicas; ``ttft_p99_s`` is None when no request finished in the window.
    ``window_s`` and ``measured_until_s`` (the caller's clock: when the oldest window that saw it
    closed) say how fresh the load is, so an expansion waits for a window measured after the
    last change rather than a fixed interval; 0 / None when unknown.
    """

    requests_per_s: float
    waiting: float
    ttft_p99_s: float | None = None
    window_s: float = 0.0
    measured_until_s: float | None = None
    busy: float = 0.0  # replicas' worth of its presence in flight (sum over replicas of its share of the window)
    pool_requests_per_s: float | None = None


IDLE = AdapterLoad(requests_per_s=0.0, waiting=0.0, ttft_p99_s=None)


@dataclass(frozen=True)
class ScalingRule:
    """When an adapter gets more or fewer replicas.

    Thresholds are per holder (``waiting / k``), so a hot adapter spread over k replicas is
    compared with what one replica can absorb.

    - **Sized from the traffic** (when the load carries the pool's rate and ``pool_replicas`` is
      set): with f = the pool's request rate / ``pool_replicas`` (a mean replica's share, at least
      ``min_fair_rps``), an adapter needs ``ceil(rate / (expand_share * f))`` holders: no holder
      carries more than ``expand_share`` of a mean replica's load for one adapter. k goes straight
      there, with no doubling cap and no wait for a window measured after the change: the rate is
      demand, which k does not change, so reading the same window again gives the same k. The
      floor on f bounds the cost in a nearly idle pool (a few requests make a large share of
      nothing); whatever the traffic, the extra copies the rate asks for sum to at most
      ``pool_replicas / expand_share`` (each adapter's rate / (expand_share f), summed).
    - Expand when waiting per holder > ``expand_waiting`` or p99 TTFT > ``expand_ttft_p99_s``,
      as soon as the load was measured mostly after the last change (its window closed at least
      half a window after it: the new holders have loaded and taken traffic), so k can grow once
      per measuring window; a load without its window's timing waits ``expand_interval_s`` instead.
      k grows in proportion to the excess, at most doubling per step, at least +1: 1, 2, 4, 8
      in three windows for an adapter far over.
    - Shrink by one after ``cooldown_s`` since the last change (expansions are not held back by
      it: expand fast, shrink slow), and only when waiting per holder
      *after* the shrink stays <= ``shrink_waiting`` and p99 TTFT (when known) <= ``shrink_ttft_p99_s``,
      and, with a rate, only when ``ceil(rate / (shrink_share * f)) < k``.
      ``shrink_* < expand_*`` is the hysteresis band: a shrink can never satisfy an expand.
    - k stays in [``k_min``, ``k_max``]; ``place`` clips it further to the pool's size.
    - ``max_new_copies`` (None: no limit) bounds the copies all expansions of one ``next_k`` add
      together: each new copy is a load from disk that stalls its replica's batch, and a slow
      replica's TTFT marks every adapter busy there, so an unbounded fast rule expands the victims
      with the cause and the loads themselves keep the replicas slow (measured: bench regime (e)).
      The budget goes to the expansions the rate asks for first (most holders short, relative to
      k), then the highest TTFT/queue pressure, then the adapter busiest across replicas (a hot
      adapter, in flight all the time on all its holders, before its co-tenants), then name: the
      rate names the cause, while a slow replica's TTFT names every adapter queued there.
    """

    expand_waiting: float = 4.0
    shrink_waiting: float = 1.0
    expand_ttft_p99_s: float | None = 2.0
    shrink_ttft_p99_s: float | None = 1.0
    expand_interval_s: float = 5.0
    cooldown_s: float = 300.0
    k_min: int = 1
    k_max: int = 1_000_000
    max_new_copies: int | None = None
    pool_replicas: int = 0  # n, for the fair share f = the pool's rate / n; 0: k is not sized from rates
    expand_share: float = 0.25
    shrink_share: float = 0.125
    min_fair_rps: float = 2.0  # floor on f: below it the pool counts as nearly idle

    def __post_init__(self) -> None:
        problems = []
        if self.pool_replicas < 0:
            problems.append(f"pool_replicas={self.pool_replicas} must be >= 0 (0: no rate rule)")
        if not 0 < self.shrink_share < self.expand_share:
            problems.append(
                f"shrink_share={self.shrink_share} must be > 0 and below expand_share={self.expand_share}"
                " (the hysteresis band)"
            )
        if not self.min_fair_rps > 0:
            problems.append(f"min_fair_rps={self.min_fair_rps} must be > 0 (the floor on a replica's fair share)")
        if self.max_new_copies is not None and self.max_new_copies < 1:
            problems.append(f"max_new_copies={self.max_new_copies} must be >= 1 (or None: no budget)")
        if not 1 <= self.k_min <= self.k_max:
            problems.append(f"k_min={self.k_min}, k_max={self.k_max}: need 1 <= k_min <= k_max")
        if not 0 <= self.shrink_waiting < self.expand_waiting:
            problems.append(
                f"shrink_waiting={self.shrink_waiting} must be >= 0 and below expand_waiting={self.expand_waiting}"
                " (the hysteresis band)"
            )
        if (self.expand_ttft_p99_s is None) != (self.shrink_ttft_p99_s is None):
            problems.append("expand_ttft_p99_s and shrink_ttft_p99_s are set together or not at all")
        elif (
            self.expand_ttft_p99_s is not None
            and self.shrink_ttft_p99_s is not None
            and not 0 < self.shrink_ttft_p99_s < self.expand_ttft_p99_s
        ):
            problems.append(
                f"shrink_ttft_p99_s={self.shrink_ttft_p99_s} must be > 0 and below "
                f"expand_ttft_p99_s={self.expand_ttft_p99_s} (the hysteresis band)"
            )
        if self.expand_interval_s < 0 or self.cooldown_s < 0:
            problems.append(f"expand_interval_s={self.expand_interval_s}, cooldown_s={self.cooldown_s} must be >= 0")
        if problems:
            raise ValueError("ScalingRule: " + "; ".join(problems))


@dataclass(frozen=True)
class KState:
    """An adapter's current k and when it last changed (seconds, the caller's clock)."""

    k: int
    changed_at_s: float


def _pressure(load: AdapterLoad, k: int, rule: ScalingRule) -> float:
    """How far over the expand thresholds the adapter is (> 1: expand), the larger of queue and TTFT."""
    ratio = (load.waiting / k) / rule.expand_waiting
    if rule.expand_ttft_p99_s is not None and load.ttft_p99_s is not None:
        ratio = max(ratio, load.ttft_p99_s / rule.expand_ttft_p99_s)
    return ratio


def rate_k(load: AdapterLoad, rule: ScalingRule, share: float) -> int | None:
    """Holders the adapter's rate needs so that none carries more than ``share`` of a mean replica's
    load (f = the pool's rate / ``pool_replicas``, at least ``min_fair_rps``); None without a rate."""
    if load.pool_requests_per_s is None or rule.pool_replicas < 1:
        return None
    fair = max(load.pool_requests_per_s / rule.pool_replicas, rule.min_fair_rps)
    return max(0, math.ceil(load.requests_per_s / (share * fair) - 1e-9))  # 1e-9: a rate exactly at a step


def _short(load: AdapterLoad, k: int, rule: ScalingRule) -> float:
    """How far short of the holders its rate needs the adapter is, relative to k (0: not short or no rate)."""
    need = rate_k(load, rule, rule.expand_share)
    return need / k if need is not None and need > k else 0.0


def _calm_after_shrink(load: AdapterLoad, k: int, rule: ScalingRule) -> bool:
    """True when k-1 holders would still sit below the shrink thresholds (and, with a rate, its share band)."""
    if load.waiting / (k - 1) > rule.shrink_waiting:
        return False
    need = rate_k(load, rule, rule.shrink_share)
    if need is not None and need >= k:
        return False
    return rule.shrink_ttft_p99_s is None or load.ttft_p99_s is None or load.ttft_p99_s <= rule.shrink_ttft_p99_s


def _measured_since_change(current: KState | None, load: AdapterLoad, since: float, rule: ScalingRule) -> bool:
    """True when ``load`` reflects the adapter's current k: measured mostly after its last change.

    With the window's timing: the (oldest) window closed at least half a window after the
    change. Without it: ``expand_interval_s`` has passed since the change.
    """
    if current is None:
        return True
    if load.measured_until_s is not None and load.window_s > 0:
        return load.measured_until_s - current.changed_at_s >= load.window_s / 2
    return since >= rule.expand_interval_s


def step_k(current: KState | None, load: AdapterLoad, now: float, rule: ScalingRule) -> KState:
    """One adapter's next k (see ``ScalingRule``). A new adapter starts at ``k_min``, free to expand at once."""
    k = min(max(current.k if current else rule.k_min, rule.k_min), rule.k_max)
    since = now - current.changed_at_s if current else math.inf
    changed_at = current.changed_at_s if current else now
    pressure = _pressure(load, k, rule)
    grown = k
    if pressure > 1.0 and k < rule.k_max and _measured_since_change(current, load, since, rule):
        grown = min(rule.k_max, 2 * k, max(k + 1, math.ceil(k * pressure)))
    need = rate_k(load, rule, rule.expand_share)
    if need is not None:
        grown = max(grown, min(need, rule.k_max))
    if grown > k:
        return KState(grown, now)
    if k > rule.k_min and since >= rule.cooldown_s and _calm_after_shrink(load, k, rule):
        return KState(k - 1, now)
    if current is not None and k != current.k:  # k_min/k_max moved under it
        return KState(k, now)
    return KState(k, changed_at)


def next_k(
    state: Mapping[str, KState], load: Mapping[str, AdapterLoad], now: float, rule: ScalingRule
) -> dict[str, KState]:
    """Every adapter's next k: those in ``state`` or ``load`` (an adapter without load is idle),
    expansions within ``rule.max_new_copies`` (most short of its rate's k, then highest pressure,
    then busiest, first)."""
    names = sorted(set(state) | set(load))
    out = {a: step_k(state.get(a), load.get(a, IDLE), now, rule) for a in names}
    if rule.max_new_copies is None:
        return out

    def was(a: str) -> int:
        current = state.get(a)
        return min(max(current.k if current else rule.k_min, rule.k_min), rule.k_max)

    grown = [a for a in names if out[a].k > was(a)]
    if sum(out[a].k - was(a) for a in grown) <= rule.max_new_copies:
        return out
    seen = {a: load.get(a, IDLE) for a in grown}
    budget = rule.max_new_copies
    order = sorted(
        grown,
        key=lambda a: (-_short(seen[a], was(a), rule), -_pressure(seen[a], was(a), rule), -seen[a].busy, a),
    )
    for a in order:
        add = min(out[a].k - was(a), budget)
        budget -= add
        if add == 0:  # no budget left: stays as it was, free to expand on the next step
            current = state.get(a)
            out[a] = KState(was(a), current.changed_at_s if current and current.k == was(a) else now)
        else:
            out[a] = KState(was(a) + add, now)
    return out
