"""Fair dispatch's virtual token counter: the service bound between backlogged keys, no banked
credit for idle keys, class weights, the estimate's correction and the memory bound."""

from __future__ import annotations

import random
from collections import deque

import pytest

from lorapool.api.traffic import Priority
from lorapool.router.core.fairness import CLASS_WEIGHTS, VirtualTokenCounter, bound, cost, estimate
from lorapool.router.core.waitqueue import WaitQueues


def dispatch(
    arrivals: dict[str, list[tuple[int, float]]], steps: int, priorities: dict[str, Priority] | None = None
) -> tuple[list[str], dict[str, list[float]]]:
    """Serve one request per step from the key with the smallest counter (``WaitQueues`` + the
    counter, as the scheduler does). ``arrivals``: key -> (step, cost) of each request. Returns the
    order served and each key's weighted service after every step."""
    priorities = priorities or {}
    vtc = VirtualTokenCounter()
    queues: WaitQueues[float] = WaitQueues(limit=10**6)
    pending = {k: deque(sorted(v)) for k, v in arrivals.items()}
    served: list[str] = []
    service = {k: [] for k in arrivals}
    totals = dict.fromkeys(arrivals, 0.0)
    for step in range(steps):
        for key, queue in pending.items():
            while queue and queue[0][0] <= step:
                _, c = queue.popleft()
                if not queues.depth(key):
                    vtc.backlogged(key, queues.depths())
                queues.push(key, c, float(step), priorities.get(key, Priority.STANDARD).rank)
        order = queues.models_by_age(None, vtc.order)
        if order:
            key = order[0]
            c = queues.pop(key)
            priority = priorities.get(key, Priority.STANDARD)
            vtc.charge(key, c, priority)
            totals[key] += c / CLASS_WEIGHTS[priority]
            served.append(key)
        for key in arrivals:
            service[key].append(totals[key])
    return served, service


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keys", [2, 3, 8])
def test_backlogged_keys_service_stays_within_the_bound(seed: int, keys: int) -> None:
    rng = random.Random(seed)
    largest = 0.0
    arrivals: dict[str, list[tuple[int, float]]] = {}
    for k in range(keys):
        # every key backlogged from step 0 with more than it can be served, costs differing per key
        costs = [cost(rng.randint(10, 600), rng.randint(1, 300)) for _ in range(400)]
        largest = max(largest, *costs)
        arrivals[f"k{k}"] = [(0, c) for c in costs]
    _, service = dispatch(arrivals, steps=300)
    for step in range(300):
        values = [service[k][step] for k in arrivals]
        assert max(values) - min(values) <= bound(largest), f"step {step}: {values}"


def test_a_flood_does_not_delay_a_light_key_beyond_one_dispatch() -> None:
    flood = [(0, cost(100, 50))] * 200
    light = [(s, cost(100, 50)) for s in range(10, 200, 20)]
    served, _ = dispatch({"flood": flood, "light": light}, steps=200)
    positions = [i for i, k in enumerate(served) if k == "light"]
    arrived = [s for s, _ in light]
    # served within one step of arriving (the flood's head may go first on a tie)
    assert all(p - a <= 1 for p, a in zip(positions, arrived, strict=True)), (positions, arrived)


def test_an_idle_key_banks_no_credit() -> None:
    # "late" sends nothing for 100 steps while "busy" is served, then both stay backlogged:
    # late is lifted to busy's counter, so from then on they alternate instead of late taking 100 in a row.
    busy = [(0, 100.0)] * 300
    late = [(100, 100.0)] * 100
    served, _ = dispatch({"busy": busy, "late": late}, steps=160)
    after = served[100:]
    assert max(len(run) for run in "".join("L" if k == "late" else "B" for k in after).split("B")) <= 1


def test_weights_share_the_pool_by_class_without_starving_anyone() -> None:
    steps = 600
    arrivals = {k: [(0, 100.0)] * steps for k in ("crit", "std", "shed")}
    priorities = {"crit": Priority.CRITICAL, "std": Priority.STANDARD, "shed": Priority.SHEDDABLE}
    served, _ = dispatch(arrivals, steps=steps, priorities=priorities)
    counts = {k: served.count(k) for k in arrivals}
    assert counts["crit"] == pytest.approx(2 * counts["std"], rel=0.02)
    assert counts["std"] == pytest.approx(2 * counts["shed"], rel=0.02)
    assert counts["shed"] > 0


def test_ties_go_to_the_higher_class_then_to_the_older_head() -> None:
    vtc = VirtualTokenCounter()
    queues: WaitQueues[str] = WaitQueues(limit=10)
    queues.push("old-standard", "a", 0.0, Priority.STANDARD.rank)
    queues.push("new-critical", "b", 1.0, Priority.CRITICAL.rank)
    queues.push("new-standard", "c", 2.0, Priority.STANDARD.rank)
    assert queues.models_by_age(None, vtc.order) == ["new-critical", "old-standard", "new-standard"]


def test_the_estimate_is_replaced_by_what_the_response_used() -> None:
    vtc = VirtualTokenCounter()
    charged = estimate(100, 200)
    assert charged == cost(100, 200) == 100 + 2 * 200
    vtc.charge("sql", charged, Priority.STANDARD)
    vtc.correct("sql", charged, cost(100, 10), Priority.STANDARD)  # it stopped after 10 tokens
    assert vtc.counter("sql") == pytest.approx(cost(100, 10) / CLASS_WEIGHTS[Priority.STANDARD])
    assert estimate(100, None) > estimate(100, 1)  # no max_tokens: the default estimate
    vtc.correct("never-charged", 10.0, 0.0, Priority.STANDARD)  # nothing to correct, no key made
    assert len(vtc) == 1


def test_memory_is_bounded_by_max_keys() -> None:
    vtc = VirtualTokenCounter(max_keys=50)
    for i in range(1000):
        vtc.charge(f"k{i}", 10.0, Priority.STANDARD)
    assert len(vtc) == 50
    assert vtc.counter("k0") == vtc.counter("never-seen")  # an evicted key restarts at the floor


@pytest.mark.parametrize(
    ("charges", "want"),
    [
        ((2, 0), False),  # within the bound: 2 x 100 beyond light is 2 x the largest charge, not more
        ((3, 0), True),  # past it: the flood waits for light's slot
        ((3, 1), False),  # light was served meanwhile: back within the bound
    ],
    ids=["within the bound", "past the bound", "the gap closed"],
)
def test_a_key_ahead_by_more_than_the_bound_waits_for_the_key_behind(charges: tuple[int, int], want: bool) -> None:
    vtc = VirtualTokenCounter()
    vtc.backlogged("light", [])
    vtc.backlogged("flood", ["light"])
    flood, light = charges
    for _ in range(flood):
        vtc.charge("flood", 200, Priority.STANDARD)  # 100 weighted each: the largest charge
    for _ in range(light):
        vtc.charge("light", 200, Priority.STANDARD)
    assert vtc.ahead("flood", ["light"]) is want
    assert not vtc.ahead("light", ["flood"])
    assert not vtc.ahead("flood", []) and not vtc.ahead("flood", ["flood"])  # nobody behind: never waits
