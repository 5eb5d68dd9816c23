"""The sizing step, pure: status.recommendation from the sidecars' reports, and the opt-in loop's
guard rails (bounded steps, one change per period, judged against an equal window, rollback)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lorapool.api.clock import rfc3339
from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.api.pods import engine_pods
from lorapool.api.report import ANNOTATION, Observations, ReplicaReport, encode
from lorapool.api.status import SizingStatus
from lorapool.controller.tuning import (
    KEPT,
    ROLLED_BACK,
    WATCHING,
    PodWindow,
    bounded_step,
    pod_windows,
    size,
    tuned_max_loras,
)
from lorapool.plan.planner import AdapterRank, Plan, plan_pool

NOW = 1_800_000_000.0
ADAPTERS = [AdapterRank(f"a{i}", f"spec.adapters[{i}]", 16) for i in range(320)]


def pool(**tuning: Any) -> LoRAPool:
    lora = {"tuning": tuning} if tuning else {}
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "baseModel": {"name": "meta-llama/Meta-Llama-3-8B-Instruct", "source": "hf://m/l"},
                "gpu": {"product": "A100-80GB"},
                "lora": lora,
            },
        }
    )
    assert isinstance(obj, LoRAPool)
    return obj


def plan_for(p: LoRAPool, tuned: int | None = None) -> Plan:
    return plan_pool(p.spec, ADAPTERS, tuned=tuned)


def window(
    max_loras: int,
    *,
    end: float = NOW - 10,
    p95: float = 8.0,
    ttft: float = 0.5,
    done: int = 600,
    pod: str = "engine-0",
) -> PodWindow:
    return PodWindow(
        pod,
        Observations(
            window_s=60.0,
            end=end,
            samples=30,
            max_loras=max_loras,
            distinct_p50=p95 / 2,
            distinct_p95=p95,
            distinct_max=int(p95) + 2,
            slot_wait_s=0.0,
            kv_wait_s=0.0,
            kv_usage_p50=0.2,
            kv_usage_p95=0.4,
            kv_usage_max=0.5,
            running_p95=40.0,
            waiting_p95=0.0,
            preemptions=0,
            finished=done,
            ttft_p50_s=0.05,
            ttft_p99_s=ttft,
        ),
    )


AUTO_SLOTS = plan_for(pool()).max_loras  # 134 for 320 rank-16 adapters


def sizing(applied: int, previous: int, *, ago_s: float, verdict: str, **kw: Any) -> SizingStatus:
    return SizingStatus(
        applied_max_loras=applied,
        previous_max_loras=previous,
        last_change_time=rfc3339(NOW - ago_s),
        reason="test",
        verdict=verdict,
        baseline_ttft_p99_seconds=kw.get("ttft", 0.5),
        baseline_goodput=kw.get("goodput", 10.0),
        rejected_max_loras=kw.get("rejected"),
    )


def test_recommend_only_writes_the_recommendation_and_changes_nothing() -> None:
    p = pool()
    result = size(p, plan_for(p), None, [window(AUTO_SLOTS)], NOW, serving=1)
    assert result.sizing is None and result.events == ()
    r = result.recommendation
    assert r is not None and (r.action, r.max_loras, r.current) == ("Shrink", 10, AUTO_SLOTS)
    assert r.kv_cache_tokens > 0 and "frees" in r.evidence and r.observed_at == rfc3339(NOW - 10)
    assert r.window_seconds == 60.0 and r.replicas == 1 and r.samples == 30


def test_windows_of_engines_on_other_flags_are_not_evidence() -> None:
    p = pool()
    r = size(p, plan_for(p), None, [window(AUTO_SLOTS + 1)], NOW, serving=1).recommendation
    assert r is not None and r.action == "InsufficientData" and r.max_loras == AUTO_SLOTS


def test_turning_apply_off_drops_the_applied_value_with_an_event() -> None:
    p = pool(apply=False)
    result = size(p, plan_for(p), sizing(67, AUTO_SLOTS, ago_s=10, verdict=KEPT), [], NOW, serving=0)
    assert result.sizing is None and [e.reason for e in result.events] == ["SizingStopped"]
    assert tuned_max_loras(p, {"status": {"sizing": sizing(67, 134, ago_s=1, verdict=KEPT).to_wire()}}) is None
    on = pool(apply=True)
    assert tuned_max_loras(on, {"status": {"sizing": sizing(67, 134, ago_s=1, verdict=KEPT).to_wire()}}) == 67
    assert tuned_max_loras(on, {"status": {}}) is None


@pytest.mark.parametrize(
    ("current", "target", "factor", "want"),
    [(134, 10, 2.0, 67), (134, 100, 2.0, 100), (8, 100, 2.0, 16), (1, 5, 1.5, 2), (3, 1, 4.0, 1)],
    ids=["shrink-halves", "within-step", "grow-doubles", "grows-at-least-one", "shrinks-to-one"],
)
def test_bounded_step(current: int, target: int, factor: float, want: int) -> None:
    assert bounded_step(current, target, factor) == want


CHANGES: dict[str, tuple[SizingStatus | None, list[PodWindow], int | None, str | None, list[str]]] = {
    # name: (status.sizing before, windows, applied after, verdict after, event reasons)
    "first-change-is-bounded-and-watched": (None, [window(AUTO_SLOTS)], 67, WATCHING, ["SizingApplied"]),
    "thin-evidence-changes-nothing": (None, [], None, None, []),
    "rate-limited-within-the-period": (
        sizing(100, 134, ago_s=600, verdict=KEPT),
        [window(100)],
        100,
        KEPT,
        [],
    ),
    "after-the-period-the-next-step": (
        sizing(100, 134, ago_s=1900, verdict=KEPT),
        [window(100)],
        50,
        WATCHING,
        ["SizingApplied"],
    ),
    "watching-waits-for-a-window-after-the-change": (
        sizing(67, 134, ago_s=30, verdict=WATCHING),
        [window(67)],  # closed 10 s ago, opened 70 s ago: before the change
        67,
        WATCHING,
        [],
    ),
    "watching-ignores-engines-still-on-the-old-value": (
        sizing(67, 134, ago_s=300, verdict=WATCHING),
        [window(134)],
        67,
        WATCHING,
        [],
    ),
    "no-worse-is-kept": (
        sizing(67, 134, ago_s=300, verdict=WATCHING),
        [window(67, ttft=0.52, done=600)],
        67,
        KEPT,
        ["SizingKept"],
    ),
    "slower-ttft-rolls-back": (
        sizing(67, 134, ago_s=300, verdict=WATCHING),
        [window(67, ttft=0.8)],
        134,
        ROLLED_BACK,
        ["SizingRolledBack"],
    ),
    "lower-goodput-rolls-back": (
        sizing(67, 134, ago_s=300, verdict=WATCHING),
        [window(67, done=480)],  # 8 req/s after vs 10 before
        134,
        ROLLED_BACK,
        ["SizingRolledBack"],
    ),
    "a-rolled-back-direction-is-not-retried-as-far": (
        sizing(134, 67, ago_s=4000, verdict=ROLLED_BACK, rejected=67),
        [window(134)],
        134,
        ROLLED_BACK,
        [],
    ),
}


@pytest.mark.parametrize(("before", "windows", "applied", "verdict", "events"), CHANGES.values(), ids=CHANGES.keys())
def test_the_apply_loop(
    before: SizingStatus | None, windows: list[PodWindow], applied: int | None, verdict: str | None, events: list[str]
) -> None:
    p = pool(apply=True)
    plan = plan_for(p, tuned=before.applied_max_loras if before else None)
    result = size(p, plan, before, windows, NOW, serving=len(windows))
    got = result.sizing
    assert (got.applied_max_loras if got else None, got.verdict if got else None) == (applied, verdict)
    assert [e.reason for e in result.events] == events
    if events:
        assert all(e.message for e in result.events)
    if verdict == ROLLED_BACK and events:
        assert got is not None and got.rejected_max_loras == before.applied_max_loras if before else False
        assert result.events[0].type == "Warning" and "rollbackMargin" in result.events[0].message
        assert got.last_change_time == rfc3339(NOW)
    if verdict == WATCHING and events:
        assert got is not None and got.baseline_goodput == pytest.approx(10.0) and got.baseline_ttft_p99_seconds == 0.5
        assert got.previous_max_loras == plan.max_loras and "bounded step" in result.events[0].message


def test_a_smaller_step_in_a_rolled_back_direction_is_allowed() -> None:
    p = pool(apply=True, maxStepFactor=1.2)
    before = sizing(134, 67, ago_s=4000, verdict=ROLLED_BACK, rejected=67)
    result = size(p, plan_for(p, tuned=134), before, [window(134)], NOW, serving=1)
    assert result.sizing is not None and result.sizing.applied_max_loras == 112  # ceil(134 / 1.2)


def test_a_change_waits_for_a_window_from_every_serving_engine() -> None:
    """Goodput is the pool's sum: one of two replicas' window would make a baseline of half of it."""
    p = pool(apply=True)
    one = size(p, plan_for(p), None, [window(AUTO_SLOTS)], NOW, serving=2)
    assert one.sizing is None and one.events == ()
    assert one.recommendation is not None and one.recommendation.action == "Shrink"  # still shown
    both = size(p, plan_for(p), None, [window(AUTO_SLOTS), window(AUTO_SLOTS, pod="engine-1")], NOW, serving=2)
    assert both.sizing is not None and both.sizing.verdict == WATCHING
    assert both.sizing.baseline_goodput == pytest.approx(20.0) and "on 2 replica(s)" in both.sizing.reason


def test_a_verdict_waits_for_a_window_from_every_serving_engine() -> None:
    """One replica on the new value beside one still silent: halved goodput is no reason to roll back."""
    p = pool(apply=True)
    before = sizing(67, 134, ago_s=300, verdict=WATCHING, goodput=20.0)
    plan = plan_for(p, tuned=67)
    one = size(p, plan, before, [window(67)], NOW, serving=2)
    assert one.sizing == before and one.events == ()
    both = size(p, plan, before, [window(67), window(67, pod="engine-1")], NOW, serving=2)
    assert both.sizing is not None and both.sizing.verdict == KEPT and [e.reason for e in both.events] == ["SizingKept"]


def pod(name: str, obs: Observations | None, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": {ANNOTATION: encode(ReplicaReport(True, observations=obs))}}
    if deleting:
        meta["deletionTimestamp"] = "2027-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pod_windows_read_fresh_reports_of_serving_pods_only() -> None:
    fresh, stale = window(8).observations, replace(window(8).observations, end=NOW - 3600)
    pods = [
        pod("b", fresh),
        pod("a", fresh),
        pod("old", stale),
        pod("unready", fresh, ready=False),
        pod("going", fresh, deleting=True),
        pod("silent", None),
    ]
    assert [w.pod for w in pod_windows(engine_pods(pods), NOW)] == ["a", "b"]
