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
from tests.delivery.helm import REPO

from lorapool.api.models import LoRAPoolSpec
from lorapool.api.status import LoRAPoolStatus
from lorapool.controller.status import AdapterResult, Observed, merge_conditions, pool_status
from lorapool.plan.planner import plan_pool

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
    phase: str | None, ready: bool = False, degraded: bool = False, generation: int = 1, observed_generation: int = 1
) -> dict[str, Any]:
    """A LoRAAdapter as the operator's reconcile writes it (controller/reconcile.py)."""
    obj: dict[str, Any] = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {"name": "legal", "namespace": "ns", "generation": generation},
        "spec": {"poolRef": {"name": "teams"}, "source": "hf://acme/legal"},
    }
    if phase is not None:
        reason = {"Ready": "Servable", "Pending": "SourceUnreadable", "Conflict": "NameConflict"}.get(phase, "Invalid")
        message = "" if ready else f"{phase.lower()} adapter"
        obj["status"] = {
            "observedGeneration": observed_generation,
            "pool": "teams",
            "rank": 8,
            "phase": phase,
            "message": message,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": reason,
                    "message": message or "served by pool teams",
                    "observedGeneration": observed_generation,
                },
                {
                    "type": "Degraded",
                    "status": "True" if degraded else "False",
                    "reason": reason,
                    "message": message,
                    "observedGeneration": observed_generation,
                },
            ],
        }
    return obj


ADAPTERS = {
    "ready": (adapter("Ready", ready=True), "Healthy", "served by pool teams"),
    "pending-metadata": (adapter("Pending"), "Progressing", "Pending"),
    "failed": (adapter("Failed", degraded=True), "Degraded", "Invalid: failed adapter"),
    "name-conflict": (adapter("Conflict", degraded=True), "Degraded", "NameConflict"),
    "no-status-yet": (adapter(None), "Progressing", "pool teams"),
    "stale-observed-generation": (adapter("Ready", ready=True, generation=2), "Progressing", "generation 2"),
}


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
