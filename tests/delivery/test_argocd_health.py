"""Argo CD health checks (deploy/argocd/*.lua) run in a real Lua 5.1 interpreter (lupa), the
language version of Argo CD's gopher-lua, on statuses the operator's own status code computes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lupa.lua51 as lupa
import pytest
import yaml

from lorapool.api.models import LoRAPoolSpec
from lorapool.api.status import AdapterPhase, LoRAPoolStatus
from lorapool.controller.status import (
    NOWHERE,
    AdapterResult,
    Observed,
    Presence,
    adapter_object_status,
    merge_conditions,
    pool_status,
)
from lorapool.plan.planner import plan_pool
from tests.delivery.helm import REPO

ARGOCD = REPO / "deploy" / "argocd"


def run_health(script: Path, obj: Mapping[str, Any]) -> dict[str, str]:
    """Evaluate a health script the way Argo CD does: global `obj`, the chunk returns `hs`."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(script.read_text())
    return {"status": result["status"], "message": result["message"]}


def observed(**overrides: Any) -> Observed:
    base: dict[str, Any] = {
        "generation": 3,
        "plan": plan_pool(
            LoRAPoolSpec.model_validate(
                {
                    "baseModel": {"name": "meta-llama/Meta-Llama-3-8B", "source": "hf://meta-llama/Meta-Llama-3-8B"},
                    "gpu": {"product": "A100-80GB"},
                }
            ),
            [],
        ).to_status(),
        "plan_errors": (),
        "adapters": (AdapterResult("sql-coder", "Inline", 16, "Ready"),),
        "desired_replicas": 2,
        "engine": {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2},
        "engine_generation_current": True,
        "router_ready": True,
        "unschedulable": None,
        "endpoint": "http://p.ns.svc:8000/v1",
        "selector": "x=y",
    }
    return Observed(**(base | overrides))


def pool(status: LoRAPoolStatus | None, generation: int = 3) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": "p", "namespace": "ns", "generation": generation},
        "spec": {"replicas": 2},
    }
    if status is not None:
        stamped = merge_conditions([], status.conditions, "2026-01-01T00:00:00Z")
        obj["status"] = status.model_copy(update={"conditions": stamped}).to_patch()
    return obj


POOLS = {
    "ready": (pool(pool_status(observed())), "Healthy", "2/2 replicas ready"),
    "rolling-out": (
        pool(pool_status(observed(engine={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 1}))),
        "Progressing",
        "RollingOut",
    ),
    "waiting-for-router": (pool(pool_status(observed(router_ready=False))), "Progressing", "WaitingForRouter"),
    "invalid-plan": (
        pool(pool_status(observed(plan=None, plan_errors=("spec.lora.maxLoras: 64 slots leave no KV cache",)))),
        "Degraded",
        "InvalidPlan: spec.lora.maxLoras",
    ),
    "unschedulable": (
        pool(pool_status(observed(unschedulable="engine pod p-engine-0 cannot be scheduled", engine={"replicas": 2}))),
        "Degraded",
        "Unschedulable",
    ),
    "serving-with-a-failed-adapter": (
        pool(pool_status(observed(adapters=(AdapterResult("bad", "Inline", 8, "Failed", "uses DoRA"),)))),
        "Degraded",
        "adapter bad: uses DoRA",
    ),
    "no-status-yet": (pool(None), "Progressing", "Waiting for the lorapool operator to report status"),
    "stale-observed-generation": (pool(pool_status(observed()), generation=4), "Progressing", "generation 4"),
    "status-without-conditions": ({**pool(None), "status": {"observedGeneration": 3}}, "Progressing", "report status"),
}


@pytest.mark.parametrize(("obj", "status", "message"), list(POOLS.values()), ids=list(POOLS))
def test_lorapool_health(obj: dict[str, Any], status: str, message: str) -> None:
    health = run_health(ARGOCD / "health-lorapool.lua", obj)
    assert health["status"] == status, health
    assert message in health["message"], health


def adapter(
    verdict: AdapterResult | None,
    presence: Presence = NOWHERE,
    *,
    routable: bool = True,
    generation: int = 1,
    observed_generation: int = 1,
) -> dict[str, Any]:
    """A LoRAAdapter with the status the operator's own code computes (controller/status.py)."""
    obj: dict[str, Any] = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": "legal", "namespace": "ns", "generation": generation},
        "spec": {"poolRef": {"name": "teams"}, "source": "hf://acme/legal"},
    }
    if verdict is not None:
        status = adapter_object_status("teams", observed_generation, verdict, presence, routable=routable)
        stamped = merge_conditions([], status.conditions, "2026-01-01T00:00:00Z")
        obj["status"] = status.model_copy(update={"conditions": stamped}).to_patch()
    return obj


def legal(phase: AdapterPhase, message: str = "") -> AdapterResult:
    return AdapterResult("legal", "LoRAAdapter", 8, phase, message)


ENGINE_REASON = "LoRA rank 64 is greater than max_lora_rank 16."
ADAPTERS = {
    "ready": (adapter(legal(AdapterPhase.LOADING), Presence(loaded=2)), "Healthy", "loaded on 2 ready replica(s) of pool teams"),
    "loading": (adapter(legal(AdapterPhase.LOADING), Presence(loading=1)), "Progressing", "1 replica(s) loading it"),
    "waiting-for-router": (adapter(legal(AdapterPhase.LOADING), Presence(loaded=1), routable=False), "Progressing", "router has no ready pod"),
    "load-failed": (adapter(legal(AdapterPhase.LOADING), Presence(failures=(f"teams-engine-0: {ENGINE_REASON}",))), "Degraded", f"LoadFailed: failed to load on 1 replica(s): {ENGINE_REASON}"),
    "pending-metadata": (adapter(legal(AdapterPhase.PENDING)), "Progressing", "Pending"),
    "failed": (adapter(legal(AdapterPhase.FAILED, "uses DoRA")), "Degraded", "Invalid: uses DoRA"),
    "name-conflict": (adapter(legal(AdapterPhase.CONFLICT, "pool teams declares legal inline")), "Degraded", "NameConflict"),
    "no-status-yet": (adapter(None), "Progressing", "pool teams"),
    "stale-observed-generation": (adapter(legal(AdapterPhase.LOADING), Presence(loaded=1), generation=2), "Progressing", "generation 2"),
}  # fmt: skip


@pytest.mark.parametrize(("obj", "status", "message"), list(ADAPTERS.values()), ids=list(ADAPTERS))
def test_loraadapter_health(obj: dict[str, Any], status: str, message: str) -> None:
    health = run_health(ARGOCD / "health-loraadapter.lua", obj)
    assert health["status"] == status, health
    assert message in health["message"], health


def test_argocd_cm_snippet_in_the_docs_carries_the_same_lua() -> None:
    """docs/gitops.md shows the argocd-cm keys users paste; they must be these scripts, verbatim."""
    text = (REPO / "docs" / "gitops.md").read_text()
    blocks = [d for b in re.findall(r"```yaml\n(.*?)```", text, re.S) for d in yaml.safe_load_all(b)]
    (cm,) = [b for b in blocks if isinstance(b, dict) and b.get("metadata", {}).get("name") == "argocd-cm"]
    data = cm["data"]
    assert data["resource.customizations.health.lorapool.io_LoRAPool"] == (ARGOCD / "health-lorapool.lua").read_text()
    assert (
        data["resource.customizations.health.lorapool.io_LoRAAdapter"]
        == (ARGOCD / "health-loraadapter.lua").read_text()
    )
    assert (
        data["resource.customizations.health.inference.networking.k8s.io_InferencePool"]
        == (ARGOCD / "health-inferencepool.lua").read_text()
    )


def parent(name: str, **conditions: str) -> dict[str, Any]:
    return {
        "parentRef": {"name": name, "kind": "Gateway"},
        "conditions": [{"type": t, "status": v, "reason": f"{t}{v}", "message": ""} for t, v in conditions.items()],
    }


INFERENCE_POOLS = {
    "no-status": ({}, "Progressing", "No Gateway reports"),
    "no-parent": ({"status": {"parents": []}}, "Progressing", "reference it from an HTTPRoute"),
    "accepted": ({"status": {"parents": [parent("gw", Accepted="True", ResolvedRefs="True")]}}, "Healthy", "Accepted by gw"),
    "refused": ({"status": {"parents": [parent("gw", Accepted="False")]}}, "Degraded", "gw: AcceptedFalse"),
    "unresolved-picker": ({"status": {"parents": [parent("gw", Accepted="True", ResolvedRefs="False")]}}, "Degraded", "ResolvedRefsFalse"),
    "one-refuses": ({"status": {"parents": [parent("a", Accepted="True"), parent("b", Accepted="False")]}}, "Degraded", "b: "),
    "pending": ({"status": {"parents": [parent("gw", Accepted="Unknown")]}}, "Progressing", "Waiting for a Gateway"),
}  # fmt: skip


@pytest.mark.parametrize(("obj", "status", "message"), list(INFERENCE_POOLS.values()), ids=list(INFERENCE_POOLS))
def test_inferencepool_health(obj: dict[str, Any], status: str, message: str) -> None:
    health = run_health(ARGOCD / "health-inferencepool.lua", {"metadata": {"name": "p"}, **obj})
    assert health["status"] == status, health
    assert message in health["message"], health
