"""Pool and adapter status from observations, in the one status model; no control plane."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.api.routerpolicy import PolicyState
from lorapool.api.status import AdapterPhase, ConditionType, LoRAAdapterStatus, LoRAPoolStatus
from lorapool.controller import replan
from lorapool.controller.books import SharedBooksObserved
from lorapool.controller.gateway import GatewayObserved
from lorapool.controller.status import (
    AdapterResult,
    Observed,
    Presence,
    RouterPolicyObserved,
    adapter_object_status,
    invalid_spec_status,
    merge_conditions,
    pool_status,
    status_changed,
)
from lorapool.controller.writes import WriteFailure, write_failed_condition
from lorapool.plan.planner import AdapterRank, plan_pool


def spec_pool(**lora: Any) -> LoRAPool:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "baseModel": {"name": "meta-llama/Meta-Llama-3-8B", "source": "hf://meta-llama/Meta-Llama-3-8B"},
                "gpu": {"product": "A100-80GB"},
                "lora": lora,
            },
        }
    )
    assert isinstance(obj, LoRAPool)
    return obj


PLAN = plan_pool(spec_pool().spec, [AdapterRank("a", "spec.adapters[0]", 8)])
BASE = Observed(
    generation=3,
    plan=PLAN.to_status(),
    plan_errors=(),
    adapters=(AdapterResult("a", "Inline", 8, AdapterPhase.LOADING),),
    desired_replicas=2,
    engine={"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2},
    engine_generation_current=True,
    router_ready=True,
    unschedulable=None,
    endpoint="http://p.ml.svc:8000/v1",
    selector="x=y",
)


def conditions(status: LoRAPoolStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}


CASES = {
    "ready": (BASE, "True", "PoolReady", "False"),
    "rolling": (
        replace(BASE, engine={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}),
        "False",
        "RollingOut",
        "False",
    ),
    "waiting-for-replicas": (
        replace(BASE, engine={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}),
        "False",
        "WaitingForReplicas",
        "False",
    ),
    "waiting-for-router": (replace(BASE, router_ready=False), "False", "WaitingForRouter", "False"),
    "unschedulable": (replace(BASE, unschedulable="no GPU node"), "True", "PoolReady", "True"),
    "invalid-plan": (replace(BASE, plan=None, plan_errors=("too big",)), "False", "InvalidPlan", "True"),
    "failed-adapter": (
        replace(BASE, adapters=(AdapterResult("d", "Inline", 8, AdapterPhase.FAILED, "DoRA"),)),
        "True",
        "PoolReady",
        "True",
    ),
    "pending-without-reason-is-no-problem": (
        replace(BASE, adapters=(AdapterResult("d", "Inline", None, AdapterPhase.PENDING),)),
        "True",
        "PoolReady",
        "False",
    ),
}


@pytest.mark.parametrize(("observed", "ready", "reason", "degraded"), list(CASES.values()), ids=list(CASES))
def test_pool_conditions(observed: Observed, ready: str, reason: str, degraded: str) -> None:
    got = conditions(pool_status(observed))
    assert got["Ready"] == (ready, reason)
    assert got["Degraded"][0] == degraded
    assert got["Stalled"][0] == ("True" if observed.plan_errors else "False")
    assert got["Reconciling"][0] == got["Progressing"][0]


AVAILABLE = {
    "converged": (BASE, ("True", "MinimumReplicasAvailable")),
    # Not Ready, still serving: a roll, a lost replica, an invalid new spec over running pods.
    "rolling": (
        replace(BASE, engine={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}),
        ("True", "MinimumReplicasAvailable"),
    ),
    "one-replica-down": (
        replace(BASE, engine={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}),
        ("True", "MinimumReplicasAvailable"),
    ),
    "invalid-plan-over-running-pods": (
        replace(BASE, plan=None, plan_errors=("too big",)),
        ("True", "MinimumReplicasAvailable"),
    ),
    "no-replica-ready": (
        replace(BASE, engine={"replicas": 2, "readyReplicas": 0, "updatedReplicas": 2}),
        ("False", "NoReadyReplicas"),
    ),
    "no-router": (replace(BASE, router_ready=False), ("False", "WaitingForRouter")),
    "scaled-to-zero": (replace(BASE, desired_replicas=0, engine={"replicas": 0}), ("False", "ScaledToZero")),
}


@pytest.mark.parametrize(("observed", "available"), list(AVAILABLE.values()), ids=list(AVAILABLE))
def test_available_says_whether_requests_are_served_now(observed: Observed, available: tuple[str, str]) -> None:
    """Ready waits for convergence; Available (as a Deployment's) is what a pipeline sending traffic waits on."""
    assert conditions(pool_status(observed))["Available"] == available


@pytest.mark.parametrize("observed", list(CASES.values()), ids=list(CASES))
def test_every_condition_type_written_is_documented(observed: tuple[Observed, str, str, str]) -> None:
    """The CRD's Condition.type description is generated from ConditionType: it must list what is written."""
    written = {c.type for c in pool_status(observed[0]).conditions}
    written |= {c.type for c in invalid_spec_status(["x"], 1).conditions}
    gateway_door = replace(
        observed[0], gateway=GatewayObserved("ml", "p", served=False, inference_pool=None, picker_ready=False)
    )
    written |= {c.type for c in pool_status(gateway_door).conditions}
    routers = replace(observed[0], router_policy=RouterPolicyObserved("h", (("p-router-0", PolicyState("h")),)))
    written |= {c.type for c in pool_status(routers).conditions}
    several = replace(observed[0], shared_books=SharedBooksObserved(shared=False, replicas=2))
    written |= {c.type for c in pool_status(several).conditions}
    for phase in AdapterPhase:
        written |= {
            c.type for c in adapter_object_status("p", 1, AdapterResult("a", "LoRAAdapter", 8, phase)).conditions
        }
    refused = write_failed_condition([WriteFailure("apply", "ConfigMap", "p-adapters", 413, "too large")], 1)
    assert refused is not None
    written.add(refused.type)
    flags = replan.Flags(8, 16, 16)
    held = replan.Replan(replan.Action.SETTLE, flags, replace(flags, max_loras=32), "0" * 12, after_s=5.0)
    written.add(replan.condition(held, "p", 10, 1).type)
    assert written <= set(ConditionType)
    assert written == set(ConditionType)


def test_planner_warnings_reach_status() -> None:
    plan = plan_pool(spec_pool(maxLoras=32).spec, [AdapterRank("a", "spec.adapters[0]", 8)])
    assert plan.warnings, "the fixture needs a plan with a warning"
    status = pool_status(replace(BASE, plan=plan.to_status()))
    wire = status.to_patch()
    assert wire["plan"]["warnings"] == list(plan.warnings)
    ready = next(c for c in wire["conditions"] if c["type"] == "Ready")
    assert f"warning: {plan.warnings[0]}" in ready["message"]
    assert "warnings" not in pool_status(BASE).to_patch()["plan"]  # none: the field is left out


def test_status_patch_clears_what_is_no_longer_true() -> None:
    wire = pool_status(replace(BASE, plan=None, plan_errors=("too big",))).to_patch()
    assert "plan" in wire and wire["plan"] is None  # a merge patch must null the old plan
    assert wire["adapters"] == [
        {"name": "a", "sourceKind": "Inline", "rank": 8, "phase": "Loading", "loadedReplicas": 0}
    ]
    invalid = invalid_spec_status(["spec.gpu: missing"], 4).to_patch()
    assert set(invalid) == {"observedGeneration", "conditions"}  # an invalid spec leaves the rest alone
    adapter = adapter_object_status("p", 2, AdapterResult("a", "LoRAAdapter", None, AdapterPhase.PENDING)).to_patch()
    assert adapter["rank"] is None and adapter["pool"] == "p" and adapter["loadedReplicas"] == 0
    conflict = adapter_object_status("p", 2, AdapterResult("a", "LoRAAdapter", None, AdapterPhase.CONFLICT, "x"))
    assert conflict.to_patch()["loadedReplicas"] is None  # not served: no count (a stale one is cleared)


def test_adapter_object_status() -> None:
    failed = adapter_object_status("p", 2, AdapterResult("a", "LoRAAdapter", 8, AdapterPhase.FAILED, "DoRA"))
    assert isinstance(failed, LoRAAdapterStatus) and failed.phase == AdapterPhase.FAILED
    assert [(c.type, c.status, c.reason) for c in failed.conditions] == [
        ("Accepted", "False", "Invalid"),
        ("Ready", "False", "Invalid"),
        ("Degraded", "True", "Invalid"),
    ]
    accepted = adapter_object_status("p", 2, AdapterResult("a", "LoRAAdapter", 8, AdapterPhase.LOADING))
    assert [(c.type, c.status, c.reason) for c in accepted.conditions] == [
        ("Accepted", "True", "Accepted"),
        ("Ready", "False", "Loading"),
        ("Degraded", "False", "Healthy"),
    ]


def test_an_adapters_status_names_the_digest_its_loaded_copies_resolved_to() -> None:
    """An oci:// tag's digest (an hf:// branch's commit) is the adapter's identity: its status says it,
    and says both while replicas hold different ones (a tag that moved between their fetches)."""
    ready = AdapterResult("a", "LoRAAdapter", 8, AdapterPhase.LOADING)
    one = adapter_object_status("p", 1, ready, Presence(loaded=2, revisions=("sha256:" + "a" * 64,)), routable=True)
    assert one.resolved_revision == "sha256:" + "a" * 64
    two = adapter_object_status("p", 1, ready, Presence(loaded=2, revisions=("sha256:1", "sha256:2")), routable=True)
    assert two.resolved_revision == "sha256:1, sha256:2"
    assert adapter_object_status("p", 1, ready, Presence(loaded=1), routable=True).resolved_revision is None


def test_merge_conditions_keeps_the_transition_time_while_status_holds() -> None:
    new = pool_status(BASE).conditions
    first = merge_conditions([], new, "t1")
    stored = [c.to_wire() for c in first]
    again = merge_conditions(stored, new, "t2")
    assert {c.last_transition_time for c in again} == {"t1"}
    flipped = merge_conditions(stored, pool_status(replace(BASE, router_ready=False)).conditions, "t3")
    times = {c.type: c.last_transition_time for c in flipped}
    assert times["Ready"] == "t3" and times["Degraded"] == "t1"


def test_an_unchanged_pool_writes_nothing() -> None:
    status = pool_status(BASE)
    stored = status.model_copy(update={"conditions": merge_conditions([], status.conditions, "t1")}).to_patch()
    again = status.model_copy(update={"conditions": merge_conditions(stored["conditions"], status.conditions, "t2")})
    assert not status_changed(stored, again.to_patch())
    assert status_changed(stored, pool_status(replace(BASE, router_ready=False)).to_patch())


def test_an_accepted_adapter_of_a_pool_without_a_plan_says_why_it_will_not_load() -> None:
    verdict = AdapterResult("a", "LoRAAdapter", 64, AdapterPhase.LOADING)
    status = adapter_object_status("p", 2, verdict, blocked="spec.lora.maxLoraRank=8 is below a's rank 64")
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "PoolNotServing") and "maxLoraRank=8" in ready.message
    assert next(c for c in status.conditions if c.type == "Accepted").status == "True"


NEW, OLD, BAD = "a1b2c3d4e5f60718", "0011223344556677", "ffeeddccbbaa9988"
ROUTER_POLICY_CASES = {
    "every-router-runs-the-rendered-document": (
        (("r-0", PolicyState(NEW)), ("r-1", PolicyState(NEW))),
        ("True", "Accepted", "2/2 router pod(s) run policy document a1b2c3d4e5f60718"),
    ),
    "one-not-re-read-yet": (
        (("r-0", PolicyState(NEW)), ("r-1", PolicyState(OLD))),
        ("True", "Accepted", "1/2 router pod(s) run policy document a1b2c3d4e5f60718; 1 run 0011223344556677"),
    ),
    "one-refused-the-edit": (
        (("r-0", PolicyState(NEW)), ("r-1", PolicyState(OLD, refused=BAD, reason="no scorer named 'x'"))),
        ("False", "Refused", "router pod r-1 refused policy document ffeeddccbbaa9988: no scorer named 'x'; it runs"),
    ),
    "none-reported-yet": ((("r-0", None),), ("Unknown", "NotReported", "no router pod has reported")),
    "no-router-pods": ((), ("Unknown", "NotReported", "no router pod runs")),
}


@pytest.mark.parametrize(("routers", "want"), list(ROUTER_POLICY_CASES.values()), ids=list(ROUTER_POLICY_CASES))
def test_router_policy_condition_says_what_the_routers_run(
    routers: tuple[tuple[str, PolicyState | None], ...], want: tuple[str, str, str]
) -> None:
    status = pool_status(replace(BASE, router_policy=RouterPolicyObserved(NEW, routers)))
    [got] = [c for c in status.conditions if c.type == ConditionType.ROUTER_POLICY_ACCEPTED]
    assert (got.status, got.reason) == want[:2]
    assert got.message.startswith(want[2])


def test_router_policy_condition_comes_from_the_router_pods_annotation() -> None:
    """The router's publisher writes the annotation, api.pods reads it, decide compares it with the render."""
    from lorapool.api.pods import router_pods
    from lorapool.api.routerpolicy import ANNOTATION, encode_state
    from lorapool.controller.decide import router_policy_observed
    from lorapool.render.manifests import router_policy

    pool = spec_pool()
    rendered = router_policy(pool).hash
    refused = PolicyState(rendered, refused=BAD, reason="--policy-file /f: profiles.strict.filters.0: ...")
    listed = [
        {"metadata": {"name": "p-router-a", "annotations": {ANNOTATION: encode_state(refused)}}},
        {"metadata": {"name": "p-router-b", "annotations": {ANNOTATION: encode_state(PolicyState(rendered))}}},
        {"metadata": {"name": "p-router-c", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
    ]
    observed = router_policy_observed(pool, router_pods(listed))
    assert observed.routers == (("p-router-a", refused), ("p-router-b", PolicyState(rendered)))
    got = pool_status(replace(BASE, router_policy=observed)).conditions[-1]
    assert (got.type, got.status, got.reason) == ("RouterPolicyAccepted", "False", "Refused")
    assert "router pod p-router-a refused policy document ffeeddccbbaa9988" in got.message
