"""The reconcile's placement step (plan.holders), table by table: slots, k from spec and load, status fields."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from lorapool.api.clock import rfc3339
from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.api.pods import EnginePod, RouterPod, engine_pod, engine_pods, router_pod
from lorapool.api.report import AdapterLoad as ReplicaLoad
from lorapool.api.report import Observations, ReplicaReport, encode
from lorapool.api.requests import ANNOTATION as REQUESTS
from lorapool.api.requests import RequestWindow
from lorapool.api.requests import encode as encode_requests
from lorapool.api.status import PlacementMode
from lorapool.controller import decide
from lorapool.controller.status import AdapterResult, pool_status
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.holders import (
    PodSlot,
    assign_slots,
    decide_placement,
    observed_load,
    pod_slots,
    previous_k,
    request_rates,
    scaling_rule,
    slot_patches,
)
from lorapool.plan.placement import AdapterLoad, KState, rendezvous
from lorapool.render import names
from lorapool.render.manifests import RenderOptions

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


def pool(n_adapters: int = 4, replicas: int = 4, lora: dict[str, Any] | None = None, **placement: Any) -> LoRAPool:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml", "generation": 1},
            "spec": {
                "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
                "gpu": {"product": "A100-80GB"},
                "replicas": replicas,
                "adapters": [{"name": f"a{i}", "source": f"hf://acme/a{i}", "rank": 16} for i in range(n_adapters)],
                "lora": lora or {},
                "placement": placement,
            },
        }
    )
    assert isinstance(obj, LoRAPool), obj
    return obj


def names_of(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


# --- slots -----------------------------------------------------------------------------------


def ps(name: str, slot: int | None, created: str = "t1", terminating: bool = False) -> PodSlot:
    return PodSlot(name, slot, created, terminating, None if slot is None else str(-slot))


@pytest.mark.parametrize(
    ("pods", "replicas", "want"),
    [
        pytest.param([ps("x", None, "t1"), ps("y", None, "t2")], 2, {"x": 0, "y": 1}, id="new-pods-oldest-first"),
        pytest.param([ps("x", 1), ps("y", None)], 2, {"x": 1, "y": 0}, id="a-slot-is-kept-for-life"),
        pytest.param(
            [ps("old", 2, terminating=True), ps("a", 0), ps("b", 1), ps("new", None, "t9")],
            3,
            {"old": None, "a": 0, "b": 1, "new": 2},
            id="rolling-update-replacement-takes-the-slot-of-the-pod-it-replaces",
        ),
        pytest.param(
            [ps("a", 0), ps("b", 1), ps("c", 2)], 2, {"a": 0, "b": 1, "c": None}, id="beyond-replicas-no-slot"
        ),
        pytest.param(
            [ps("a", 0), ps("c", 3), ps("d", None, "t5")], 3, {"a": 0, "c": 1, "d": 2}, id="scale-down-reslots-the-rest"
        ),
        pytest.param(
            [ps("a", 1, "t1"), ps("b", 1, "t2")], 2, {"a": 1, "b": 0}, id="duplicate-slot-the-older-pod-keeps-it"
        ),
    ],
)
def test_assign_slots(pods: list[PodSlot], replicas: int, want: dict[str, int | None]) -> None:
    assert assign_slots(pods, replicas) == want


def test_slot_patches_touch_only_stale_pods_and_set_the_deletion_cost() -> None:
    pods = [ps("a", 0), PodSlot("b", None, "t2", False), ps("gone", 5, terminating=True)]
    patches = slot_patches(pods, assign_slots(pods, 2))
    assert patches == {"b": {names.SLOT_ANNOTATION: "1", names.POD_DELETION_COST_ANNOTATION: "-1"}}


def test_a_pod_beyond_replicas_loses_its_slot_and_goes_first_on_the_scale_down() -> None:
    pods = [ps("a", 0), ps("b", 1), ps("c", 2)]
    patches = slot_patches(pods, assign_slots(pods, 2))  # scaled 3 -> 2 before the ReplicaSet deleted c
    assert patches == {"c": {names.SLOT_ANNOTATION: None, names.POD_DELETION_COST_ANNOTATION: "-1000000"}}


def test_pod_slots_read_the_annotations() -> None:
    pod = {
        "metadata": {
            "name": "p-engine-1",
            "creationTimestamp": "2026-12-03T00:00:00Z",
            "annotations": {names.SLOT_ANNOTATION: "3", names.POD_DELETION_COST_ANNOTATION: "-3"},
        }
    }
    assert pod_slots(engine_pods([pod, {"metadata": {"name": "x", "deletionTimestamp": "now"}}])) == [
        PodSlot("p-engine-1", 3, "2026-12-03T00:00:00Z", False, "-3"),
        PodSlot("x", None, "", True, None),
    ]


# --- mode and k ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "adapters", "capacity", "mode", "k"),
    [
        pytest.param({}, 4, 8, PlacementMode.ALL_REPLICAS, None, id="auto-small-pool-every-replica"),
        pytest.param({}, 8, 8, PlacementMode.ALL_REPLICAS, None, id="auto-catalog-exactly-fits"),
        pytest.param({}, 9, 8, PlacementMode.K_OF_N, 1, id="auto-catalog-beyond-the-cache-k_min"),
        pytest.param({"minReplicas": 2}, 9, 8, PlacementMode.K_OF_N, 2, id="auto-minReplicas"),
        pytest.param({"replicasPerAdapter": 2}, 4, 8, PlacementMode.K_OF_N, 2, id="explicit-n-even-when-small"),
        pytest.param({"replicasPerAdapter": 9}, 4, 8, PlacementMode.K_OF_N, 9, id="explicit-n-above-N-kept-as-asked"),
    ],
)
def test_mode_and_k(spec: dict[str, Any], adapters: int, capacity: int, mode: PlacementMode, k: int | None) -> None:
    got = decide_placement(pool(adapters, **spec), names_of(adapters), capacity, {}, {}, now=100.0)
    assert got.status.mode == mode
    if k is None:
        assert got.holders is None and got.placed("a0", 4) == 4
    else:
        assert {s.k for s in got.k.values()} == {k}
        assert {len(h) for h in got.holders.values()} == {min(k, 4)}  # type: ignore[union-attr]


def test_overrides_pin_to_every_replica_or_a_number_and_name_unknown_adapters() -> None:
    p = pool(
        9,
        overrides=[{"name": "a1", "replicas": "all"}, {"name": "a2", "replicas": 3}, {"name": "ghost", "replicas": 2}],
    )
    got = decide_placement(p, names_of(9), 8, {}, {}, now=0.0)
    assert got.holders is not None
    assert got.holders["a1"] == (0, 1, 2, 3) and len(got.holders["a2"]) == 3 and len(got.holders["a3"]) == 1
    assert "ghost" in got.status.reason


def test_a_numeric_override_turns_placement_on_in_a_small_pool() -> None:
    got = decide_placement(pool(4, overrides=[{"name": "a0", "replicas": 1}]), names_of(4), 8, {}, {}, now=0.0)
    assert got.status.mode == PlacementMode.K_OF_N and got.placed("a0", 4) == 1 and got.placed("a1", 4) == 1


def test_holders_follow_rendezvous_over_slot_ids() -> None:
    got = decide_placement(pool(9, replicas=5), names_of(9), 8, {}, {}, now=0.0)
    assert got.holders is not None
    for a, h in got.holders.items():
        assert h == (int(rendezvous(a, [str(i) for i in range(5)])[0]),)


def test_no_room_is_unplaced_and_said_in_status() -> None:
    got = decide_placement(pool(12, replicas=2), names_of(12), 5, {}, {}, now=0.0)
    assert got.status.unplaced == 2 and "raise spec.replicas or spec.lora.maxCpuLoras" in got.status.reason


def test_auto_k_follows_load_with_hysteresis_and_remembers_it_in_status() -> None:
    p = pool(9, scaleDownCooldownSeconds=60)
    hot = {"a3": AdapterLoad(requests_per_s=0.0, waiting=2.0)}  # 2 replicas' worth of slot waits on 1 holder
    first = decide_placement(p, names_of(9), 8, {}, hot, now=1000.0)
    assert first.k["a3"] == KState(2, 1000.0)
    # The status remembers it, the next reconcile reads it back (an operator restart keeps k).
    assert previous_k({"adapters": [{"name": "a3", "targetReplicas": 2, "targetChangedAt": rfc3339(1000.0)}]}) == {
        "a3": KState(2, 1000.0)
    }
    calm = decide_placement(p, names_of(9), 8, dict(first.k), {}, now=1030.0)
    assert calm.k["a3"].k == 2  # inside the cooldown
    later = decide_placement(p, names_of(9), 8, dict(first.k), {}, now=1061.0)
    assert later.k["a3"] == KState(1, 1061.0)


def test_fixed_k_keeps_its_timestamp_so_status_does_not_churn() -> None:
    p = pool(4, replicasPerAdapter=2)
    first = decide_placement(p, names_of(4), 8, {}, {}, now=10.0)
    again = decide_placement(p, names_of(4), 8, dict(first.k), {}, now=99.0)
    assert again.k == first.k


# --- load from the sidecars' reports ---------------------------------------------------------


def obs(adapters: dict[str, ReplicaLoad], ttft_p99_s: float | None = None) -> Observations:
    return Observations(
        window_s=60.0, end=1000.0, samples=30, max_loras=4, distinct_p50=2, distinct_p95=3, distinct_max=4,
        slot_wait_s=0.0, kv_wait_s=0.0, kv_usage_p50=0.1, kv_usage_p95=0.2, kv_usage_max=0.3, running_p95=2,
        waiting_p95=0, preemptions=0, ttft_p99_s=ttft_p99_s, adapters=adapters,
    )  # fmt: skip


def reported(name: str, o: Observations, terminating: bool = False) -> EnginePod:
    meta: dict[str, Any] = {"name": name, "annotations": {"lorapool.io/adapters": encode(ReplicaReport(True, {}, o))}}
    if terminating:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    return engine_pod({"metadata": meta})


def test_observed_load_sums_waits_over_replicas_and_takes_ttft_where_the_adapter_was_busy() -> None:
    pods = [
        reported("p0", obs({"a": ReplicaLoad(60.0, 30.0), "b": ReplicaLoad(6.0, 0.0)}, ttft_p99_s=3.0)),
        reported("p1", obs({"a": ReplicaLoad(40.0, 15.0)}, ttft_p99_s=1.5)),
        reported("gone", obs({"a": ReplicaLoad(60.0, 60.0)}), terminating=True),
        engine_pod({"metadata": {"name": "no-report"}}),
    ]
    got = observed_load(pods)
    assert got["a"] == AdapterLoad(
        requests_per_s=0.0, waiting=0.75, ttft_p99_s=3.0, window_s=60.0, measured_until_s=1000.0, busy=1.667
    )
    # in flight 10%: not its TTFT
    assert got["b"] == AdapterLoad(
        requests_per_s=0.0, waiting=0.0, ttft_p99_s=None, window_s=60.0, measured_until_s=1000.0, busy=0.1
    )


def test_observed_load_is_as_fresh_as_the_oldest_window_that_saw_the_adapter() -> None:
    old = dataclasses.replace(obs({"a": ReplicaLoad(60.0)}), end=940.0)
    long = dataclasses.replace(obs({"a": ReplicaLoad(30.0), "b": ReplicaLoad(30.0)}), window_s=90.0, end=990.0)
    got = observed_load([reported("p0", old), reported("p1", long), reported("p2", obs({"b": ReplicaLoad(6.0)}))])
    assert (got["a"].window_s, got["a"].measured_until_s) == (90.0, 940.0)
    assert (got["b"].window_s, got["b"].measured_until_s) == (90.0, 990.0)


def test_auto_k_expands_again_on_the_next_window_measured_after_the_change_not_after_a_fixed_interval() -> None:
    """2-s windows (the benchmark's): a hot adapter doubles on each fresh window, a stale one adds nothing."""
    p = pool(9, replicas=8, scaleDownCooldownSeconds=300)

    def hot(until: float) -> dict[str, AdapterLoad]:
        return {"a3": AdapterLoad(0.0, waiting=0.0, ttft_p99_s=9.0, window_s=2.0, measured_until_s=until)}

    first = decide_placement(p, names_of(9), 8, {}, hot(100.0), now=100.0)
    assert first.k["a3"] == KState(2, 100.0)
    stale = decide_placement(p, names_of(9), 8, dict(first.k), hot(100.0), now=101.0)  # the same window again
    assert stale.k["a3"] == KState(2, 100.0)
    second = decide_placement(p, names_of(9), 8, dict(stale.k), hot(102.0), now=102.0)
    assert second.k["a3"] == KState(4, 102.0) and len(second.holders["a3"]) == 4  # type: ignore[index]
    third = decide_placement(p, names_of(9), 8, dict(second.k), hot(104.0), now=104.0)
    assert third.k["a3"] == KState(8, 104.0)
    assert set(first.holders["a3"]) <= set(second.holders["a3"]) <= set(third.holders["a3"])  # type: ignore[index]


# --- request rates from the router pods ------------------------------------------------------


def router(name: str, w: RequestWindow | None, terminating: bool = False, raw: str | None = None) -> RouterPod:
    """A router Pod as the API server returns it, with its last closed window (``lorapool.io/requests``)."""
    meta: dict[str, Any] = {"name": name, "annotations": {}}
    if w is not None:
        meta["annotations"][REQUESTS] = encode_requests(w)
    if raw is not None:
        meta["annotations"][REQUESTS] = raw
    if terminating:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    return router_pod({"metadata": meta})


def window(end: float, counts: dict[str, int], other: int = 0, window_s: float = 10.0) -> RequestWindow:
    return RequestWindow(window_s=window_s, end=end, counts=counts, other=other)


@pytest.mark.parametrize(
    ("routers", "want"),
    [
        pytest.param([], None, id="no-router-pods"),
        pytest.param([router("r0", None)], None, id="an-old-router-writes-no-window"),
        pytest.param([router("r0", None, raw='{"v": 9}')], None, id="an-unreadable-window-is-none"),
        pytest.param([router("r0", window(1000.0, {"a": 50, "b": 10}, other=40))], ({"a": 5.0, "b": 1.0}, 10.0),
                     id="one-router-rates-and-the-pool-total-with-the-cut-adapters"),
        pytest.param(
            [router("r0", window(1000.0, {"a": 50})), router("r1", window(995.0, {"a": 30, "c": 6}, window_s=6.0))],
            ({"a": 10.0, "c": 1.0}, 11.0),
            id="summed-over-routers-each-by-its-own-window",
        ),
        pytest.param(
            [router("r0", window(1000.0, {"a": 50})), router("r1", window(979.0, {"a": 500}))],
            ({"a": 5.0}, 5.0),
            id="a-window-closed-over-two-windows-ago-is-stale",
        ),
        pytest.param(
            [router("r0", window(1000.0, {"a": 50})), router("r1", window(1000.0, {"a": 500}), terminating=True)],
            ({"a": 5.0}, 5.0),
            id="a-router-being-deleted-is-skipped",
        ),
        pytest.param([router("r0", window(979.0, {"a": 50}))], None, id="only-stale-windows-is-no-rate"),
        pytest.param([router("r0", window(980.0, {"a": 50}))], ({"a": 5.0}, 5.0), id="two-windows-old-is-fresh"),
    ],
)  # fmt: skip
def test_request_rates(routers: list[RouterPod], want: tuple[dict[str, float], float] | None) -> None:
    assert request_rates(routers, now=1000.0) == want


def test_observed_load_carries_each_adapters_rate_and_the_pools_beside_the_reports() -> None:
    pods = [reported("p0", obs({"a": ReplicaLoad(60.0, 30.0)}, ttft_p99_s=3.0))]
    routers = [router("r0", window(1000.0, {"a": 270, "new": 20}, other=1710))]
    got = observed_load(pods, routers, now=1001.0)
    assert got["a"] == AdapterLoad(
        requests_per_s=27.0, waiting=0.5, ttft_p99_s=3.0, window_s=60.0, measured_until_s=1000.0, busy=1.0,
        pool_requests_per_s=200.0,
    )  # fmt: skip
    # requested but in no engine report yet (placed nowhere, or just loading): its rate alone
    assert got["new"] == AdapterLoad(requests_per_s=2.0, waiting=0.0, pool_requests_per_s=200.0)
    without = observed_load(pods, [], now=1001.0)["a"]
    assert (without.requests_per_s, without.pool_requests_per_s) == (0.0, None)
    stale = observed_load(pods, routers, now=1100.0)["a"]
    assert stale.pool_requests_per_s is None


def test_auto_k_goes_straight_to_the_holders_the_adapters_share_needs() -> None:
    """16 replicas at 200 req/s: a mean replica's share is 12.5 req/s; an adapter with 27 req/s needs
    ceil(27 / (0.25 x 12.5)) = 9 holders, in one step (the TTFT rule alone would double: 2, 4, 8)."""
    p = pool(40, replicas=16, scaleDownCooldownSeconds=300)
    counts = {"a3": 270, "a7": 30}
    routers = [router("r0", window(1000.0, counts, other=2000 - 290)), router("r1", None)]
    load = observed_load([], routers, now=1002.0)
    got = decide_placement(p, names_of(40), 8, {}, load, now=1002.0)
    assert got.k["a3"] == KState(9, 1002.0) and len(got.holders["a3"]) == 9  # type: ignore[index]
    assert got.k["a7"].k == 1 and got.k["a0"].k == 1  # 3 req/s: under a quarter of 12.5
    rule = scaling_rule(p)
    assert (rule.pool_replicas, rule.expand_share, rule.shrink_share, rule.min_fair_rps) == (16, 0.25, 0.125, 2.0)


@pytest.mark.parametrize(
    ("counts", "other", "k"),
    [
        pytest.param({"a3": 3}, 1, 1, id="0.3-of-0.4-req/s-stays-on-one-replica"),
        pytest.param({"a3": 6}, 2, 2, id="0.6-req/s-gets-a-second(0.6/(0.25x2))"),
        pytest.param({"a3": 12}, 4, 3, id="1.2-of-1.6-req/s-gets-three-not-all-16"),
    ],
)
def test_a_nearly_idle_pool_spreads_only_past_half_a_request_per_second_per_holder(
    counts: dict[str, int], other: int, k: int
) -> None:
    """16 replicas carrying under 2 req/s: f is floored at 2 req/s per replica, so a few requests that
    are most of a quiet pool's traffic do not ask for every replica (unfloored: 0.3 / (0.25 x 0.025) = 48)."""
    p = pool(40, replicas=16)
    load = observed_load([], [router("r0", window(1000.0, counts, other=other))], now=1001.0)
    got = decide_placement(p, names_of(40), 8, {}, load, now=1001.0)
    assert got.k["a3"].k == k


# --- through decide and pool_status ----------------------------------------------------------


def test_decide_renders_each_adapters_slots_and_status_shows_placement() -> None:
    p = pool(9, replicas=3, lora={"maxCpuLoras": 8, "maxLoras": 4})
    merged = merge_adapters(p, [])
    verdicts = [AdapterResult(a.spec.name, a.origin, 16, decide.AdapterPhase.LOADING) for a in merged.adapters]
    d = decide.decide(p, merged, verdicts, [], RenderOptions(), now=5.0)
    assert d.placement is not None and d.placement.holders is not None
    # the router pods' counts reach k through decide: a0 has all the requests of a pool of 3
    rated = decide.decide(
        p, merged, verdicts, [], RenderOptions(), routers=[router("r0", window(4.0, {"a0": 100}))], now=5.0
    )
    assert rated.placement is not None and rated.placement.k["a0"].k == 3
    cm = next(o for o in d.objects if o["kind"] == "ConfigMap")
    listed = {a["name"]: a["replicas"] for a in json.loads(cm["data"]["adapters.json"])["adapters"]}
    assert listed == {a: list(h) for a, h in d.placement.holders.items()}
    observed = decide.observe(p, {"metadata": {"generation": 1}}, d, None, None, [])
    status = pool_status(observed).to_wire()
    assert status["placement"]["mode"] == "KOfN" and status["placement"]["capacity"] == 8
    assert {a["name"]: a["placedReplicas"] for a in status["adapters"]} == dict.fromkeys(names_of(9), 1)
    assert {a["targetReplicas"] for a in status["adapters"]} == {1}


def test_a_small_pool_renders_exactly_as_before_placement() -> None:
    p = pool(4, replicas=3)
    merged = merge_adapters(p, [])
    verdicts = [AdapterResult(a.spec.name, a.origin, 16, decide.AdapterPhase.LOADING) for a in merged.adapters]
    d = decide.decide(p, merged, verdicts, [], RenderOptions())
    cm = next(o for o in d.objects if o["kind"] == "ConfigMap")
    assert '"replicas"' not in cm["data"]["adapters.json"]  # no slot lists: every replica holds every adapter
    status = pool_status(decide.observe(p, {"metadata": {"generation": 1}}, d, None, None, [])).to_wire()
    assert status["placement"]["mode"] == "AllReplicas"
    assert {a["placedReplicas"] for a in status["adapters"]} == {3} and "targetReplicas" not in status["adapters"][0]


@pytest.mark.parametrize(("replicas", "budget"), [(1, 1), (4, 4), (16, 16)])
def test_auto_k_adds_at_most_one_new_copy_per_replica_per_step(replicas: int, budget: int) -> None:
    assert scaling_rule(pool(9, replicas=replicas)).max_new_copies == budget
