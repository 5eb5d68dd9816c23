"""The reconcile's pure decisions, table by table, with no control plane."""

from __future__ import annotations

from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAAdapter, LoRAPool
from lorapool.api.pods import engine_pods
from lorapool.api.status import AdapterPhase, LoRAAdapterStatus
from lorapool.controller import decide
from lorapool.controller.decide import Event, Fetched
from lorapool.controller.status import NOWHERE, AdapterResult, Presence, adapter_object_status
from lorapool.plan.adapters import PoolAdapter, merge_adapters
from lorapool.render.manifests import RenderOptions

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"
READY, PENDING, FAILED, CONFLICT = AdapterPhase.READY, AdapterPhase.PENDING, AdapterPhase.FAILED, AdapterPhase.CONFLICT
LOADING = AdapterPhase.LOADING  # the verdict "accepted": Ready only once a replica reports it loaded


def pool(adapters: list[dict[str, Any]] | None = None, **lora: Any) -> LoRAPool:
    obj = parse_object(
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAPool",
            "metadata": {"name": "p", "namespace": "ml", "generation": 2},
            "spec": {
                "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
                "gpu": {"product": "A100-80GB"},
                "adapters": adapters or [],
                "lora": lora,
            },
        }
    )
    assert isinstance(obj, LoRAPool)
    return obj


def adapter_body(name: str, pool_name: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"poolRef": {"name": pool_name}, "source": "hf://acme/x", **spec},
    }


def inline(rank: int | None = None) -> PoolAdapter:
    a = pool([{"name": "sql", "source": "hf://acme/sql", **({"rank": rank} if rank else {})}])
    return merge_adapters(a, []).adapters[0]


def peft(r: int = 8, **extra: Any) -> dict[str, Any]:
    return {"peft_type": "LORA", "r": r, "lora_alpha": 16, "target_modules": ["q_proj"], **extra}


JUDGE = {
    "config-read": (inline(), Fetched(config=peft(8)), LOADING, 8, ""),
    "unreadable-without-rank-waits": (inline(), Fetched(unreadable="503"), PENDING, None, "cannot read"),
    "unreadable-with-rank-uses-spec": (inline(16), Fetched(unreadable="503"), LOADING, 16, "using rank 16"),
    "refused-by-source": (inline(16), Fetched(refused="path escapes"), FAILED, 16, "path escapes"),
    "not-a-json-object": (inline(), Fetched(config=None), FAILED, None, "expected a JSON object"),
    "dora": (inline(), Fetched(config=peft(8, use_dora=True)), FAILED, 8, "DoRA"),
    "other-base": (
        inline(),
        Fetched(config=peft(8, base_model_name_or_path="mistralai/Mistral-7B")),
        FAILED,
        8,
        "Mistral",
    ),
    "spec-rank-contradicts": (inline(16), Fetched(config=peft(8)), FAILED, 8, "rank=16 but adapter_config.json says 8"),
}


@pytest.mark.parametrize(("adapter", "fetched", "phase", "rank", "message"), list(JUDGE.values()), ids=list(JUDGE))
def test_judge_adapter(
    adapter: PoolAdapter, fetched: Fetched, phase: AdapterPhase, rank: int | None, message: str
) -> None:
    result = decide.judge_adapter(adapter, BASE, fetched)
    assert (result.phase, result.rank) == (phase, rank)
    assert message in result.message and (message or not result.message)


def test_read_pool_lists_problems_instead_of_raising() -> None:
    body = {"apiVersion": "lorapool.io/v1alpha1", "kind": "LoRAPool", "metadata": {"name": "p"}, "spec": {}}
    problems = decide.read_pool(body)
    assert isinstance(problems, list) and any(p.startswith("spec.baseModel") for p in problems)


def test_pool_adapters_keeps_only_this_pool_and_reports_invalid_ones() -> None:
    bodies = [adapter_body("a"), adapter_body("b", pool_name="other"), adapter_body("c", rank=600)]
    objects = decide.pool_adapters(bodies, "p")
    assert [o.metadata.name for o in objects.valid] == ["a"]
    assert [n for n, _ in objects.invalid] == ["c"] and "rank" in objects.invalid[0][1]


def run_decide(
    p: LoRAPool, verdict_ranks: list[int | None], objects: list[LoRAAdapter] | None = None
) -> decide.Decision:
    merged = merge_adapters(p, objects or [])
    verdicts = [
        AdapterResult(a.spec.name, a.origin, r, LOADING if r else PENDING)
        for a, r in zip(merged.adapters, verdict_ranks, strict=True)
    ]
    return decide.decide(p, merged, verdicts, [("bad", "spec.rank: too big")], RenderOptions())


def test_decide_renders_a_valid_plan_and_lists_unmerged_adapters_last() -> None:
    p = pool([{"name": "a", "source": "hf://acme/a"}, {"name": "b", "source": "hf://acme/b"}])
    clash = LoRAAdapter.model_validate(adapter_body("a"))
    decision = run_decide(p, [8, None], [clash])
    assert decision.plan is not None and decision.plan.max_lora_rank == 8 and not decision.plan_errors
    assert [(r.name, r.phase) for r in decision.adapters] == [
        ("a", LOADING),
        ("b", PENDING),
        ("a", CONFLICT),
        ("bad", FAILED),
    ]
    kinds = [o["kind"] for o in decision.objects]
    assert kinds[:3] == ["ConfigMap", "ConfigMap", "Service"] and "Deployment" in kinds  # adapters, traffic
    assert set(decision.identities) == {"a", "b"}  # what the sidecars' reports are read against


def test_an_explicit_rank_below_an_adapter_is_a_plan_error_naming_it() -> None:
    p = pool([{"name": "a", "source": "hf://acme/a"}, {"name": "big", "source": "hf://acme/big"}], maxLoraRank=8)
    decision = run_decide(p, [8, 64])
    assert decision.plan is None and decision.objects == ()
    assert any("maxLoraRank=8 is below spec.adapters[1] (big) rank 64" in e for e in decision.plan_errors)


def test_decide_with_no_plan_applies_nothing_and_keeps_the_errors() -> None:
    p = pool([{"name": "a", "source": "hf://acme/a"}], maxLoras=64, maxCpuLoras=64, minKvCacheSequences=4096)
    decision = run_decide(p, [512])
    assert decision.plan is None and decision.objects == () and decision.plan_errors


def test_failed_adapters_are_not_planned_nor_rendered() -> None:
    p = pool([{"name": "a", "source": "hf://acme/a"}, {"name": "dora", "source": "hf://acme/d"}])
    merged = merge_adapters(p, [])
    verdicts = [AdapterResult("a", "Inline", 8, READY), AdapterResult("dora", "Inline", 256, FAILED, "DoRA")]
    decision = decide.decide(p, merged, verdicts, [], RenderOptions())
    assert decision.plan is not None and decision.plan.max_lora_rank == 8  # the failed rank-256 one does not count
    configmap = decision.objects[0]["data"]["adapters.json"]
    assert '"a"' in configmap and '"dora"' not in configmap


def pod(name: str, *conditions: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": list(conditions)}}


UNSCHEDULED = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
SCHEDULING = {
    "none": ([], None),
    "scheduled": ([pod("e-0", {"type": "PodScheduled", "status": "True"})], None),
    "unschedulable": ([pod("e-0"), pod("e-1", UNSCHEDULED)], "engine pod e-1 cannot be scheduled: 0/3 nodes"),
}


@pytest.mark.parametrize(("pods", "expected"), list(SCHEDULING.values()), ids=list(SCHEDULING))
def test_unschedulable(pods: list[dict[str, Any]], expected: str | None) -> None:
    got = decide.unschedulable(pool(), engine_pods(pods))
    assert got == expected if expected is None else (got is not None and got.startswith(expected))
    if got:
        assert "NVIDIA-A100-SXM4-80GB" in got and "change spec.gpu" in got


def deployment(generation: int, observed: int, ready: int) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {"observedGeneration": observed, "readyReplicas": ready, "replicas": ready, "updatedReplicas": ready},
    }


OBSERVE = {
    "absent": (None, None, False, False),
    "current-and-ready": (deployment(2, 2, 1), deployment(1, 1, 1), True, True),
    "engine-not-yet-observed": (deployment(3, 2, 1), deployment(1, 1, 0), False, False),
}


@pytest.mark.parametrize(("engine", "router", "current", "router_ready"), list(OBSERVE.values()), ids=list(OBSERVE))
def test_observe(
    engine: dict[str, Any] | None, router: dict[str, Any] | None, current: bool, router_ready: bool
) -> None:
    p = pool([{"name": "a", "source": "hf://acme/a", "rank": 8}])
    decision = run_decide(p, [8])
    o = decide.observe(p, {"metadata": {"generation": 2}}, decision, engine, router, [])
    assert (o.engine_generation_current, o.router_ready) == (current, router_ready)
    assert o.generation == 2 and o.plan is not None and o.plan.max_lora_rank == 8
    assert o.endpoint == "http://p.ml.svc:8000/v1" and o.adapters == decision.adapters


def ready(status: str, reason: str, message: str = "m") -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": status, "reason": reason, "message": message}]}


FLAGS = {"maxLoras": 8, "maxLoraRank": 16, "maxCpuLoras": 64}
EVENTS = {
    "unchanged": (ready("True", "PoolReady"), ready("True", "PoolReady"), []),
    "became-ready": (ready("False", "RollingOut"), ready("True", "PoolReady", "2/2"), [Event("PoolReady", "2/2")]),
    "rolling-is-normal": ({}, ready("False", "RollingOut", "0/1"), [Event("RollingOut", "0/1")]),
    "broken-is-a-warning": (
        ready("True", "PoolReady"),
        ready("False", "InvalidPlan", "x"),
        [Event("InvalidPlan", "x", "Warning")],
    ),
    "flags-changed": (
        {**ready("True", "PoolReady"), "plan": {**FLAGS, "maxLoraRank": 8}},
        {**ready("True", "PoolReady"), "plan": FLAGS},
        [Event("PlanChanged", "vLLM flags: maxLoras=8, maxLoraRank=16, maxCpuLoras=64")],
    ),
    "plan-gone-is-no-flag-event": (
        {**ready("True", "PoolReady"), "plan": FLAGS},
        {**ready("True", "PoolReady"), "plan": None},
        [],
    ),
}


@pytest.mark.parametrize(("old", "new", "expected"), list(EVENTS.values()), ids=list(EVENTS))
def test_pool_events(old: dict[str, Any], new: dict[str, Any], expected: list[Event]) -> None:
    assert decide.pool_events(old, new) == expected


def adapter_status(result: AdapterResult, presence: Presence = NOWHERE) -> LoRAAdapterStatus:
    return adapter_object_status("p", 1, result, presence)


def stored(result: AdapterResult, presence: Presence = NOWHERE) -> dict[str, Any]:
    return adapter_status(result, presence).to_wire()


LOADED = Presence(loaded=2)
BROKEN = Presence(failures=("p-0: rank 64 > 16",))
ADAPTER_EVENTS = {
    "accepted-is-quiet": ({}, adapter_status(AdapterResult("a", "LoRAAdapter", 8, LOADING)), []),
    "became-loaded": (
        stored(AdapterResult("a", "LoRAAdapter", 8, LOADING)),
        adapter_status(AdapterResult("a", "LoRAAdapter", 8, LOADING), LOADED),
        [Event("Loaded", "loaded on 2 ready replica(s) of pool p")],
    ),
    "became-failed": (
        stored(AdapterResult("a", "LoRAAdapter", 8, LOADING), LOADED),
        adapter_status(AdapterResult("a", "LoRAAdapter", 8, FAILED, "DoRA")),
        [Event("Invalid", "DoRA", "Warning")],
    ),
    "still-failed": (
        stored(AdapterResult("a", "LoRAAdapter", 8, FAILED, "DoRA")),
        adapter_status(AdapterResult("a", "LoRAAdapter", 8, FAILED, "DoRA")),
        [],
    ),
    "load-failed-on-the-engines": (
        stored(AdapterResult("a", "LoRAAdapter", 8, LOADING)),
        adapter_status(AdapterResult("a", "LoRAAdapter", 8, LOADING), BROKEN),
        [Event("LoadFailed", "failed to load on 1 replica(s): rank 64 > 16", "Warning")],
    ),
    "conflict": (
        {},
        adapter_status(AdapterResult("a", "LoRAAdapter", None, CONFLICT, "clash")),
        [Event("NameConflict", "clash", "Warning")],
    ),
}


@pytest.mark.parametrize(("old", "new", "expected"), list(ADAPTER_EVENTS.values()), ids=list(ADAPTER_EVENTS))
def test_adapter_events(old: dict[str, Any], new: LoRAAdapterStatus, expected: list[Event]) -> None:
    assert decide.adapter_events(old, new) == expected


def test_presence_collects_the_digests_serving_replicas_hold() -> None:
    """What the loaded copies resolved to, from serving pods only: a pod that is not Ready yet, or
    is going, does not speak for what clients get."""
    from lorapool.api.pods import EnginePod
    from lorapool.api.report import AdapterReport, ReplicaPhase, ReplicaReport, short_id
    from lorapool.controller.decide import presence

    identity = "i" * 64

    def pod(name: str, rev: str, **facts: bool) -> EnginePod:
        entry = AdapterReport(ReplicaPhase.LOADED, id=short_id(identity), loaded=short_id(identity), revision=rev)
        return EnginePod(name, ready=facts.get("ready", True), terminating=facts.get("terminating", False),
                         report=ReplicaReport(True, {"a": entry}))  # fmt: skip

    pods = [pod("p0", "sha256:new"), pod("p1", "sha256:old"), pod("p2", "sha256:x", ready=False),
            pod("p3", "sha256:y", terminating=True)]  # fmt: skip
    got = presence({"a": identity}, pods)["a"]
    assert (got.loaded, got.revisions) == (2, ("sha256:new", "sha256:old"))


def test_an_adapter_placed_on_no_replica_says_so_on_its_own_object_and_needs_a_human() -> None:
    """At 10,000 adapters on 16 replicas x maxCpuLoras 615, 160 fit nowhere: their LoRAAdapters said
    "Loading: no ready replica reports it loaded yet" for ever. Now Ready and Degraded name the room."""
    from lorapool.controller.status import NO_ROOM, unplaced_message
    from lorapool.plan.holders import decide_placement
    from tests.plan.test_holders import pool as sized_pool

    p = sized_pool(12, replicas=2)
    placement = decide_placement(p, [f"a{i}" for i in range(12)], 5, {}, {}, now=0.0)  # 10 places for 12
    unplaced = [a for a in (f"a{i}" for i in range(12)) if unplaced_message(placement, a)]
    assert len(unplaced) == 2 and placement.status.unplaced == 2
    why = unplaced_message(placement, unplaced[0])
    assert "2 replicas x maxCpuLoras 5 are full (10 adapters)" in why
    status = adapter_object_status("p", 1, AdapterResult(unplaced[0], "LoRAAdapter", 8, LOADING), placed=0, no_room=why)
    conditions = {c.type: c for c in status.conditions}
    assert (conditions["Ready"].status, conditions["Ready"].reason) == ("False", NO_ROOM)
    assert (conditions["Degraded"].status, conditions["Degraded"].reason) == ("True", NO_ROOM)
    assert "raise spec.replicas or spec.lora.maxCpuLoras" in conditions["Degraded"].message
    placed = next(a for a in (f"a{i}" for i in range(12)) if a not in unplaced)
    assert unplaced_message(placement, placed) == ""  # a placed adapter: no such words
    assert unplaced_message(None, placed) == ""  # every replica holds everything
