"""k-of-N placement: rendezvous order, capacity bounds, stability under scale, k with hysteresis."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter

import pytest

from lorapool.plan.placement import (
    IDLE,
    UNPLACED,
    AdapterLoad,
    KState,
    ScalingRule,
    moves,
    next_k,
    place,
    rate_k,
    rendezvous,
    shares,
    step_k,
)


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def catalog(n: int, k: int | None = None, seed: int = 7) -> dict[str, int]:
    """n adapters; k each, or a seeded mix of 1-4."""
    rng = random.Random(seed)
    return {f"adapter-{i:05d}": k if k is not None else rng.choice((1, 1, 1, 2, 3, 4)) for i in range(n)}


# --- rendezvous ---------------------------------------------------------------------------------


def test_rendezvous_is_a_stable_hash_pinned_across_processes_and_releases() -> None:
    # Pinned: a change here reshuffles every pool's placement on upgrade (a reload storm).
    assert rendezvous("sql-coder", ids(4)) == ["3", "2", "0", "1"]


def test_rendezvous_ignores_input_order_and_duplicates() -> None:
    replicas = ids(12)
    shuffled = replicas[::-1] + replicas[:3]
    assert rendezvous("chat", shuffled) == rendezvous("chat", replicas)
    assert sorted(rendezvous("chat", shuffled)) == sorted(replicas)


def test_rendezvous_spreads_first_choices_evenly() -> None:
    firsts = Counter(rendezvous(f"a{i}", ids(8))[0] for i in range(8000))
    assert set(firsts) == set(ids(8))
    assert max(firsts.values()) < 1.15 * 1000 and min(firsts.values()) > 0.85 * 1000, firsts


# --- place: k and capacity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("k", "replicas", "holders"),
    [
        pytest.param(1, 4, 1, id="k=1"),
        pytest.param(3, 4, 3, id="k=3-of-4"),
        pytest.param(0, 4, 1, id="k=0-clipped-to-1"),
        pytest.param(-5, 4, 1, id="negative-k-clipped-to-1"),
        pytest.param(9, 4, 4, id="k-above-N-clipped-to-N"),
        pytest.param(2, 0, 0, id="no-replicas-places-nowhere"),
    ],
)
def test_place_clips_k_to_the_pool(k: int, replicas: int, holders: int) -> None:
    got = place({"a": k}, ids(replicas), capacity=100)
    assert len(got["a"]) == holders
    assert list(got["a"]) == rendezvous("a", ids(replicas))[:holders]


def test_place_with_room_is_plain_top_k_rendezvous() -> None:
    want = catalog(300)
    got = place(want, ids(10), capacity=10_000)
    for adapter, k in want.items():
        assert list(got[adapter]) == rendezvous(adapter, ids(10))[:k], adapter


def test_place_is_deterministic_whatever_the_input_order() -> None:
    want = catalog(400)
    reordered = dict(reversed(list(want.items())))
    assert place(want, ids(9), 60) == place(reordered, ids(9)[::-1], 60)


@pytest.mark.parametrize(
    ("adapters", "replicas", "capacity"),
    [
        pytest.param(1000, 16, 100, id="1000-over-16-cap-100-room"),
        pytest.param(1000, 16, 70, id="1000-over-16-cap-70-tight"),
        pytest.param(1000, 16, 63, id="1000-over-16-cap-63-first-copies-only-just-fit"),
        pytest.param(50, 4, 5, id="50-over-4-cap-5-overfull"),
        pytest.param(10, 3, 0, id="cap-0"),
    ],
)
def test_no_replica_holds_more_than_its_capacity(adapters: int, replicas: int, capacity: int) -> None:
    got = place(catalog(adapters), ids(replicas), capacity)
    held = shares(got, ids(replicas))
    assert max(len(a) for a in held.values()) <= capacity
    for adapter, holders in got.items():
        assert len(set(holders)) == len(holders), adapter  # never two copies on one replica


def test_when_capacity_is_short_extra_copies_give_way_before_any_adapter_is_left_out() -> None:
    # 4 replicas x 3 = 12 places; 10 adapters want 2 each (20 copies): every adapter gets one copy.
    got = place({f"a{i}": 2 for i in range(10)}, ids(4), capacity=3)
    assert all(len(h) >= 1 for h in got.values())
    assert sum(len(h) for h in got.values()) == 12
    assert sorted(len(h) for h in got.values()) == [1] * 8 + [2] * 2


def test_when_adapters_outnumber_all_places_the_rest_are_unplaced_larger_k_first() -> None:
    want = {"hot": 3, **{f"cold{i}": 1 for i in range(7)}}
    got = place(want, ids(2), capacity=3)  # 6 places for 8 adapters
    assert got["hot"] != UNPLACED
    assert sum(1 for h in got.values() if h == UNPLACED) == 2
    assert [a for a, h in got.items() if h == UNPLACED] == ["cold5", "cold6"]  # ties by name, last give way


def test_a_full_replica_is_skipped_for_the_next_in_rendezvous_order() -> None:
    want = {f"a{i}": 1 for i in range(12)}
    got = place(want, ids(3), capacity=4)
    assert Counter(h[0] for h in got.values()) == {"0": 4, "1": 4, "2": 4}
    for adapter, (holder,) in got.items():
        order = rendezvous(adapter, ids(3))
        assert holder in order  # the adapter's own order, shifted past full replicas only
        assert all(len([a for a, h in got.items() if h == (r,)]) == 4 for r in order[: order.index(holder)])


def test_negative_capacity_is_refused_with_the_flag_named() -> None:
    with pytest.raises(ValueError, match="max-cpu-loras"):
        place({"a": 1}, ids(2), capacity=-1)


# --- stability: a rolling update moves nothing, scaling by one moves ~1/N ------------------------


def test_a_rolling_update_moves_nothing() -> None:
    # Pods are replaced, identities (slot indices) stay: same placement, zero loads.
    want = catalog(1000)
    assert moves(place(want, ids(16), 120), place(want, ids(16), 120)) == 0


@pytest.mark.parametrize(
    ("headroom", "bound"),
    [(100.0, 1.3), (1.2, 2.0), (1.05, 2.0)],
    ids=["room", "20%-headroom", "5%-headroom"],
)
@pytest.mark.parametrize("n", [8, 16, 32], ids=lambda n: f"N={n}")
def test_scaling_up_by_one_moves_about_one_nth(n: int, headroom: float, bound: float) -> None:
    """Capacity = the mean share x headroom: tight capacity spills a little, never a reshuffle."""
    want = catalog(1000)
    copies = sum(min(k, n) for k in want.values())
    capacity = math.ceil(copies / n * headroom)
    before, after = place(want, ids(n), capacity), place(want, ids(n + 1), capacity)
    assert all(before.values()) and all(after.values())
    ideal = copies / (n + 1)  # the new replica takes its fair share; nothing else moves
    measured = moves(before, after)
    assert 0.5 * ideal <= measured <= bound * ideal, (measured, ideal)


@pytest.mark.parametrize("n", [8, 16, 32], ids=lambda n: f"N={n}")
def test_scaling_down_by_one_moves_only_what_the_removed_replica_held(n: int) -> None:
    want = catalog(1000)
    before, after = place(want, ids(n + 1), 10_000), place(want, ids(n), 10_000)
    on_removed = len(shares(before).get(str(n), ()))
    assert moves(before, after) == on_removed  # with room, each of its copies lands once elsewhere
    assert on_removed == pytest.approx(sum(len(h) for h in before.values()) / (n + 1), rel=0.3)


def test_shares_inverts_a_placement_and_lists_empty_replicas() -> None:
    got = shares({"b": ("0", "1"), "a": ("1",)}, ids(3))
    assert got == {"0": ("b",), "1": ("a", "b"), "2": ()}


# --- k from load, with hysteresis ---------------------------------------------------------------

RULE = ScalingRule(
    expand_waiting=4.0,
    shrink_waiting=1.0,
    expand_ttft_p99_s=2.0,
    shrink_ttft_p99_s=1.0,
    expand_interval_s=5.0,
    cooldown_s=60.0,
    k_min=1,
    k_max=8,
)


def load(waiting: float, ttft: float | None = None) -> AdapterLoad:
    return AdapterLoad(requests_per_s=waiting, waiting=waiting, ttft_p99_s=ttft)


def fresh(waiting: float, window_s: float, until_s: float, ttft: float | None = None) -> AdapterLoad:
    """A load measured over a window of ``window_s`` that closed at ``until_s``."""
    return AdapterLoad(waiting, waiting, ttft, window_s=window_s, measured_until_s=until_s)


@pytest.mark.parametrize(
    ("state", "seen", "now", "want"),
    [
        pytest.param(None, IDLE, 0.0, KState(1, 0.0), id="new-idle-adapter-starts-at-k_min"),
        pytest.param(None, load(12), 0.0, KState(2, 0.0), id="new-hot-adapter-expands-at-once"),
        pytest.param(KState(2, 0.0), load(8.0), 10.0, KState(2, 0.0), id="at-threshold-holds(4/holder)"),
        pytest.param(KState(2, 0.0), load(8.1), 10.0, KState(3, 10.0), id="just-over-queue-threshold-expands"),
        pytest.param(KState(2, 0.0), load(40.0), 10.0, KState(4, 10.0), id="far-over-expands-at-most-doubling"),
        pytest.param(KState(3, 0.0), load(15.0), 10.0, KState(4, 10.0), id="expands-in-proportion(5/4*3=3.75->4)"),
        pytest.param(KState(2, 0.0), load(0.0, 2.5), 10.0, KState(3, 10.0), id="ttft-over-threshold-expands"),
        pytest.param(KState(2, 8.0), load(40.0), 10.0, KState(2, 8.0), id="expand-waits-its-interval"),
        pytest.param(KState(8, 0.0), load(400.0), 10.0, KState(8, 0.0), id="k_max-caps"),
        pytest.param(KState(7, 0.0), load(400.0), 10.0, KState(8, 10.0), id="growth-stops-at-k_max"),
        pytest.param(KState(3, 0.0), IDLE, 59.0, KState(3, 0.0), id="idle-waits-for-cooldown"),
        pytest.param(KState(3, 0.0), IDLE, 60.0, KState(2, 60.0), id="idle-after-cooldown-shrinks-by-one"),
        pytest.param(KState(3, 0.0), load(2.0), 90.0, KState(2, 90.0), id="shrinks-when-after-shrink-is-calm(2/2=1)"),
        pytest.param(KState(3, 0.0), load(2.1), 90.0, KState(3, 0.0), id="no-shrink-when-k-1-would-be-busy"),
        pytest.param(KState(3, 0.0), load(0.0, 1.5), 90.0, KState(3, 0.0), id="no-shrink-in-the-ttft-band"),
        pytest.param(KState(1, 0.0), IDLE, 900.0, KState(1, 0.0), id="k_min-floors"),
        pytest.param(KState(12, 0.0), load(10.0), 1.0, KState(8, 1.0), id="k-above-a-lowered-k_max-is-clipped"),
        # With the window's timing, expansion waits for a window measured after the change, not the interval.
        pytest.param(
            KState(2, 8.0), fresh(40.0, 2.0, 9.0), 9.0, KState(4, 9.0), id="fresh-window-expands-before-interval"
        ),
        pytest.param(
            KState(2, 8.0), fresh(40.0, 2.0, 8.9), 9.0, KState(2, 8.0), id="window-mostly-before-change-holds"
        ),
        pytest.param(
            KState(2, 8.0), fresh(40.0, 60.0, 30.0), 30.0, KState(2, 8.0), id="long-window-holds-past-interval"
        ),
        pytest.param(
            KState(2, 8.0), fresh(40.0, 60.0, 38.0), 38.0, KState(4, 38.0), id="long-window-half-after-expands"
        ),
        pytest.param(
            KState(3, 50.0), fresh(0.0, 2.0, 52.0, ttft=9.0), 52.0, KState(6, 52.0), id="just-shrunk-expands-at-once"
        ),
        pytest.param(
            KState(3, 50.0), fresh(0.0, 2.0, 52.0), 52.0, KState(3, 50.0), id="fresh-idle-still-waits-cooldown"
        ),
    ],
)
def test_step_k(state: KState | None, seen: AdapterLoad, now: float, want: KState) -> None:
    assert step_k(state, seen, now, RULE) == want


def test_next_k_covers_every_adapter_in_state_or_load() -> None:
    got = next_k({"old": KState(2, 0.0)}, {"new": load(0.0)}, 1000.0, RULE)
    assert got == {"new": KState(1, 1000.0), "old": KState(1, 1000.0)}


def test_no_flapping_under_load_that_wobbles_inside_the_band() -> None:
    """Waiting per holder wobbling between 1.5 and 3.5 (inside the 1..4 band) never changes k."""
    state = {"a": KState(3, 0.0)}
    changes = 0
    for t in range(1, 2000):
        waiting = 3 * (2.5 + (1.0 if t % 2 else -1.0))
        nxt = next_k(state, {"a": load(waiting)}, float(t), RULE)
        changes += nxt["a"].k != state["a"].k
        state = nxt
    assert changes == 0


def test_a_burst_expands_fast_then_shrinks_one_step_per_cooldown_without_reexpanding() -> None:
    """Load steps up for a minute then stops: k climbs within seconds, then walks back down."""
    state: dict[str, KState] = {}
    history: list[int] = []
    for t in range(0, 600):
        per_holder = 10.0 if t < 60 else 0.0
        k = state["a"].k if "a" in state else 1
        state = next_k(state, {"a": load(per_holder * k)}, float(t), RULE)
        history.append(state["a"].k)
    assert history[0] == 2 and max(history[:30]) == 8  # doubles each expand interval: 2, 4, 8
    assert history.index(8) <= 15
    downs = [t for t in range(1, 600) if history[t] < history[t - 1]]
    ups_after_burst = [t for t in range(61, 600) if history[t] > history[t - 1]]
    assert ups_after_burst == []
    assert all(b - a >= RULE.cooldown_s for a, b in itertools.pairwise(downs))
    assert history[-1] < 8 and history[:60] == sorted(history[:60])


def test_k_follows_load_once_per_window_and_never_past_it_on_stale_windows() -> None:
    """A hot adapter whose queue shrinks as it spreads (80/k waiting in all, 80/k^2 per holder: over the
    threshold of 4 up to k = 4), observed every second over 2-s windows that measure the k of their
    start: k grows once per window measured after the change, in steps sized by the excess (1 -> 2 ->
    4 -> 5 within three windows), then stays; a stale window never adds a step, the cooldown never delays one."""
    rule = dataclasses.replace(RULE, expand_interval_s=30.0, cooldown_s=300.0)
    state: dict[str, KState] = {"a": KState(1, -1000.0)}
    measured_k, changes = 1, []
    for t in range(0, 60):
        if t % 2 == 0:  # a window closes every 2 s; it measured the k of its first half
            measured_k = state["a"].k
        seen = fresh(waiting=80.0 / measured_k, window_s=2.0, until_s=float(t - t % 2))
        nxt = next_k(state, {"a": seen}, float(t), rule)
        if nxt["a"].k != state["a"].k:
            changes.append((t, nxt["a"].k))
        state = nxt
    assert changes == [(0, 2), (2, 4), (4, 5)]  # 80 at k 1: doubling caps; 20/4 = 5: 5/4 x 4 -> 5; 16/5 holds
    assert state["a"].k == 5


def test_a_step_adds_at_most_max_new_copies_highest_pressure_then_busiest_first() -> None:
    """Four adapters want to grow at once (+1, +2, +2, +1) with a budget of 4 new copies: the most pressed
    first; at equal pressure (one slow replica's TTFT) the one busy on more replicas; the budget's
    remainder grows the next one part way; the rest keep their k and timestamp and may grow next step."""
    rule = dataclasses.replace(RULE, max_new_copies=4)
    state = {"cause": KState(2, 0.0), "victim": KState(2, 0.0), "queue": KState(1, 0.0), "late": KState(1, 0.0)}
    seen = {
        "cause": AdapterLoad(0.0, 0.0, 9.0, busy=2.0),  # TTFT 4.5x over: doubles, +2
        "victim": AdapterLoad(0.0, 0.0, 9.0, busy=0.6),  # same replica's TTFT: +2, but less busy
        "queue": AdapterLoad(0.0, 20.0, None, busy=1.0),  # waiting 5x over: the most pressed, +1 (k 1 -> 2)
        "late": AdapterLoad(0.0, 4.4, None, busy=1.0),  # 1.1x over: last, +1
    }
    got = next_k(state, seen, 10.0, rule)
    assert got == {
        "queue": KState(2, 10.0),
        "cause": KState(4, 10.0),
        "victim": KState(3, 10.0),  # the last copy of the budget
        "late": KState(1, 0.0),  # nothing left: unchanged
    }
    unlimited = next_k(state, seen, 10.0, RULE)
    assert {a: s.k for a, s in unlimited.items()} == {"queue": 2, "cause": 4, "victim": 4, "late": 2}


def test_the_budget_never_touches_shrinks_or_an_expansion_that_fits() -> None:
    rule = dataclasses.replace(RULE, max_new_copies=1)
    state = {"hot": KState(1, 0.0), "idle": KState(3, 0.0)}
    got = next_k(state, {"hot": load(8.1)}, 100.0, rule)
    assert got == {"hot": KState(2, 100.0), "idle": KState(2, 100.0)}


# --- k sized from the adapter's share of the traffic ----------------------------------------------

# 16 replicas, 200 req/s: a mean replica's share f = 12.5 req/s; expand past 0.5 f = 6.25 req/s per
# holder, shrink below 0.25 f = 3.125 req/s per holder; f floored at 1 req/s.
RATE_RULE = dataclasses.replace(RULE, k_max=16, pool_replicas=16, expand_share=0.5, shrink_share=0.25, min_fair_rps=1.0)


def rated(rps: float, pool_rps: float = 200.0, ttft: float | None = None, waiting: float = 0.0) -> AdapterLoad:
    """A load with its rate measured by the routers (the pool's total alongside)."""
    return AdapterLoad(requests_per_s=rps, waiting=waiting, ttft_p99_s=ttft, pool_requests_per_s=pool_rps)


@pytest.mark.parametrize(
    ("state", "seen", "now", "want"),
    [
        pytest.param(KState(1, 0.0), rated(27.0), 10.0, KState(5, 10.0), id="hot-goes-straight-to-its-k(27/6.25)"),
        pytest.param(None, rated(27.0), 0.0, KState(5, 0.0), id="new-hot-adapter-starts-at-its-k"),
        pytest.param(KState(1, 0.0), rated(6.25), 10.0, KState(1, 0.0), id="at-half-a-fair-share-holds"),
        pytest.param(KState(1, 0.0), rated(6.3), 10.0, KState(2, 10.0), id="just-over-half-a-fair-share-expands"),
        pytest.param(KState(2, 9.5), rated(27.0), 10.0, KState(5, 10.0), id="no-wait-for-a-window-after-the-change"),
        pytest.param(KState(1, 0.0), rated(150.0), 10.0, KState(16, 10.0), id="k_max-caps(150/6.25=24)"),
        pytest.param(KState(3, 0.0), rated(1.0), 30.0, KState(3, 0.0), id="shrink-waits-for-the-cooldown"),
        pytest.param(KState(5, 0.0), rated(27.0), 900.0, KState(5, 0.0), id="no-shrink-while-rate-needs-it"),
        pytest.param(KState(5, 0.0), rated(12.6), 900.0, KState(5, 0.0), id="no-shrink-inside-the-band(12.6/3.125->5)"),
        pytest.param(KState(5, 0.0), rated(12.5), 900.0, KState(4, 900.0), id="shrinks-below-the-band(12.5/3.125=4)"),
        pytest.param(KState(5, 0.0), rated(0.0), 900.0, KState(4, 900.0), id="no-traffic-shrinks-by-one"),
        pytest.param(
            KState(5, 0.0), rated(1.0, ttft=1.5), 900.0, KState(5, 0.0), id="rate-calm-but-ttft-in-band-holds"
        ),
        pytest.param(KState(1, 0.0), rated(0.5, ttft=9.0), 10.0, KState(2, 10.0), id="ttft-still-a-second-trigger"),
        pytest.param(
            KState(4, 0.0), rated(27.0, ttft=9.0), 10.0, KState(8, 10.0), id="the-larger-of-ttft-and-rate(8>5)"
        ),
        # A nearly idle pool: 0.4 req/s in all. f is floored at min_fair_rps (1 req/s), so 75 % of nothing
        # is not 75 % of the pool (which would ask ceil(0.3 / (0.5 x 0.025)) = 24 holders).
        pytest.param(KState(1, 0.0), rated(0.3, pool_rps=0.4), 10.0, KState(1, 0.0), id="idle-pool-floor-holds"),
        pytest.param(KState(1, 0.0), rated(1.2, pool_rps=1.6), 10.0, KState(3, 10.0), id="idle-pool-floor-sizes"),
        pytest.param(KState(3, 0.0), rated(0.3, pool_rps=0.4), 900.0, KState(2, 900.0), id="idle-pool-shrinks"),
    ],
)
def test_step_k_sized_from_the_rate(state: KState | None, seen: AdapterLoad, now: float, want: KState) -> None:
    assert step_k(state, seen, now, RATE_RULE) == want


@pytest.mark.parametrize(
    ("seen", "rule", "want"),
    [
        pytest.param(rated(27.0), RATE_RULE, 5, id="27-of-200-over-16"),
        pytest.param(rated(0.0), RATE_RULE, 0, id="no-requests"),
        pytest.param(load(27.0), RATE_RULE, None, id="no-rate-measured"),
        pytest.param(rated(27.0), RULE, None, id="rule-without-pool-size"),
        pytest.param(rated(27.0, pool_rps=0.0), RATE_RULE, 54, id="no-pool-total-floors-f"),
    ],
)
def test_rate_k(seen: AdapterLoad, rule: ScalingRule, want: int | None) -> None:
    assert rate_k(seen, rule, rule.expand_share) == want


def test_a_rate_never_flaps_inside_the_share_band() -> None:
    """k = 5 at 200 req/s over 16 replicas holds for any rate in (12.5, 31.25]: 2,000 steps between 13 and 31."""
    rng = random.Random(5)
    state = {"a": KState(5, 0.0)}
    changes = 0
    for t in range(1, 2000):
        nxt = next_k(state, {"a": rated(rng.uniform(13.0, 31.0))}, float(t), RATE_RULE)
        changes += nxt["a"].k != state["a"].k
        state = nxt
    assert changes == 0


def test_a_rate_that_halves_walks_k_down_one_step_per_cooldown_and_never_back_up() -> None:
    state = {"a": KState(1, -1000.0)}
    history = []
    for t in range(0, 400):
        state = next_k(state, {"a": rated(27.0 if t < 100 else 8.0)}, float(t), RATE_RULE)
        history.append(state["a"].k)
    assert history[0] == 5 and set(history[:100]) == {5}
    assert history[-1] == 3  # 8 / 3.125 -> 3: the band's lower edge, reached one step per 60-s cooldown
    assert history[100:] == sorted(history[100:], reverse=True)
    downs = [t for t in range(1, 400) if history[t] < history[t - 1]]
    assert all(b - a >= RATE_RULE.cooldown_s for a, b in itertools.pairwise(downs))


def test_the_budget_goes_to_what_the_rate_asks_for_before_a_slow_replicas_victims() -> None:
    """One replica is slow: its TTFT marks the hot adapter and a rare co-tenant alike. The rate says which
    one is the cause: the hot adapter takes the budget (4 copies: k 1 -> 5), the victim waits."""
    rule = dataclasses.replace(RATE_RULE, max_new_copies=4)
    state = {"hot": KState(1, 0.0), "victim": KState(1, 0.0)}
    seen = {"hot": rated(27.0, ttft=9.0), "victim": rated(0.2, ttft=12.0)}
    assert next_k(state, seen, 10.0, rule) == {"hot": KState(5, 10.0), "victim": KState(1, 0.0)}
    more = dataclasses.replace(rule, max_new_copies=5)
    assert next_k(state, seen, 10.0, more) == {"hot": KState(5, 10.0), "victim": KState(2, 10.0)}


@pytest.mark.parametrize("share", [0.25, 0.5])
@pytest.mark.parametrize("pool_rps", [0.05, 3.0, 200.0, 5000.0])
def test_the_copies_a_rate_asks_for_are_bounded_whatever_the_traffic(pool_rps: float, share: float) -> None:
    """Each adapter's rate / (expand_share f), summed, is the pool's rate / (expand_share f) =
    pool_replicas / expand_share at most (f floored: fewer): 64 or 32 extra copies for 16 replicas, here
    Zipf over 1,000 adapters and a pool at any rate, from nearly idle to far over."""
    rule = dataclasses.replace(RATE_RULE, expand_share=share, shrink_share=share / 2)
    weights = [1.0 / (i + 1) for i in range(1000)]
    rates = [pool_rps * w / sum(weights) for w in weights]
    extra = sum(max(0, (rate_k(rated(r, pool_rps), rule, share) or 0) - 1) for r in rates)
    assert extra <= 16 / share
    if max(rates) <= share * rule.min_fair_rps:  # nearly idle: no spread at all
        assert extra == 0
    assert extra > 0 or pool_rps < 200.0  # a loaded pool spreads its hot adapters


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"shrink_share": 0.5}, "hysteresis band", id="no-share-band"),
        pytest.param({"shrink_share": 0.0}, "shrink_share=0.0", id="zero-shrink-share"),
        pytest.param({"min_fair_rps": 0.0}, "min_fair_rps=0.0", id="no-floor"),
        pytest.param({"pool_replicas": -1}, "pool_replicas=-1", id="negative-pool"),
    ],
)
def test_scaling_rule_refuses_a_share_rule_that_could_flap(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalingRule(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"k_min": 0}, "k_min=0", id="k_min-0"),
        pytest.param({"k_min": 4, "k_max": 2}, "k_min <= k_max", id="k_min-above-k_max"),
        pytest.param({"shrink_waiting": 4.0}, "hysteresis band", id="no-queue-band"),
        pytest.param({"shrink_ttft_p99_s": 3.0}, "hysteresis band", id="no-ttft-band"),
        pytest.param({"shrink_ttft_p99_s": None}, "set together", id="ttft-half-set"),
        pytest.param({"cooldown_s": -1.0}, "cooldown_s=-1.0", id="negative-cooldown"),
        pytest.param({"max_new_copies": 0}, "max_new_copies=0", id="no-budget-at-all"),
    ],
)
def test_scaling_rule_refuses_a_rule_that_could_flap_or_cannot_hold(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScalingRule(**kwargs)  # type: ignore[arg-type]


def reference_place(want: dict[str, int], replicas: list[str], capacity: int) -> dict[str, tuple[str, ...]]:
    """The rule of ``place`` written plainly (full rendezvous order, no lazy ranking): the oracle."""
    k = {a: max(1, min(n, len(replicas))) for a, n in want.items()}
    order = sorted(k, key=lambda a: (-k[a], a))
    load = dict.fromkeys(replicas, 0)
    held: dict[str, list[str]] = {a: [] for a in order}
    for copy in range(max(k.values(), default=0)):
        for a in order:
            if k[a] <= copy or len(held[a]) < copy:
                continue
            free = [r for r in rendezvous(a, replicas) if r not in held[a] and load[r] < capacity]
            # the next free replica *after* the last one chosen, in rendezvous order
            last = rendezvous(a, replicas).index(held[a][-1]) if held[a] else -1
            after = [r for r in free if rendezvous(a, replicas).index(r) > last]
            if after:
                held[a].append(after[0])
                load[after[0]] += 1
    return {a: tuple(held[a]) for a in sorted(held)}


@pytest.mark.parametrize("seed", range(6))
def test_place_matches_the_plain_rule_under_tight_capacity(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    want = {f"a{i}": rng.choice((1, 1, 2, 3, 9)) for i in range(rng.randint(5, 60))}
    capacity = rng.randint(1, 8)
    assert place(want, ids(n), capacity) == reference_place(want, ids(n), capacity)
