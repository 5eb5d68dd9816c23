"""One reconcile reads each engine pod's sidecar report once: the Pods are parsed into
``lorapool.api.pods.EnginePod`` values once per list, and every step (decide, placement, slots,
signals, observe, sizing) reads those. The reconcile runs for real here, over an in-memory Kube."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from lorapool.api import report as reports
from lorapool.api.pods import POD_DELETION_COST_ANNOTATION, SLOT_ANNOTATION
from lorapool.api.report import ANNOTATION, AdapterLoad, AdapterReport, Observations, ReplicaPhase, ReplicaReport
from lorapool.controller.reconcile import PoolReconciler, Settings
from lorapool.render import names
from lorapool.render.manifests import RenderOptions

N = 5
BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


class MemoryKube:
    """The reconcile's Kube calls over dicts: objects by (kind, namespace, name); writes bump resourceVersion."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
        self.version = 100
        self.events: list[str] = []

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        want = dict(kv.split("=", 1) for kv in selector.split(",")) if selector else {}
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in sorted(self.objects.items())
            if k == kind and ns == namespace and want.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def apply(self, obj: dict[str, Any]) -> bool:
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        self.objects[key] = copy.deepcopy(obj)
        self._bump(self.objects[key])
        return True

    def annotate(self, kind: str, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        obj = self.objects[(kind, namespace, name)]
        current = obj["metadata"].setdefault("annotations", {})
        for k, v in annotations.items():
            current.pop(k, None) if v is None else current.__setitem__(k, v)
        self._bump(obj)

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        obj = self.objects[(kind, namespace, name)]
        obj["status"] = {**(obj.get("status") or {}), **status}
        self._bump(obj)

    def event(self, involved: dict[str, Any], *, reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append(reason)

    def serves(self, group_version: str, plural: str) -> bool:
        return False  # no InferencePool CRD: these pools have the router door only

    def delete(self, kind: str, namespace: str, name: str, uid: str) -> None:
        obj = self.objects.get((kind, namespace, name))
        if obj is not None and obj["metadata"].get("uid") == uid:
            del self.objects[(kind, namespace, name)]


def pool_body() -> dict[str, Any]:
    return {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": "p", "namespace": "ml", "generation": 1, "resourceVersion": "1"},
        "spec": {
            "baseModel": {"name": BASE, "source": f"hf://{BASE}"},
            "gpu": {"product": "A100-80GB"},
            "replicas": N,
            "adapters": [{"name": f"a{i}", "source": f"hf://acme/a{i}", "rank": 8} for i in range(3)],
        },
    }


def engine_pod_body(slot: int) -> dict[str, Any]:
    obs = Observations(
        window_s=60.0, end=4_000_000_000.0, samples=30, max_loras=4, distinct_p50=1, distinct_p95=2, distinct_max=2,
        slot_wait_s=0.0, kv_wait_s=0.0, kv_usage_p50=0.1, kv_usage_p95=0.2, kv_usage_max=0.3, running_p95=1,
        waiting_p95=0, preemptions=0, finished=60, adapters={"a0": AdapterLoad(30.0)},
    )  # fmt: skip
    report = ReplicaReport(True, {"a0": AdapterReport(ReplicaPhase.LOADING, "0" * 16)}, obs)
    labels = dict(kv.split("=", 1) for kv in names.selector_string("p", "engine").split(","))
    return {
        "kind": "Pod",
        "metadata": {
            "name": f"p-engine-{slot}",
            "namespace": "ml",
            "resourceVersion": str(10 + slot),
            "creationTimestamp": f"2026-12-03T00:00:0{slot}Z",
            "labels": labels,
            # slots already assigned: the reconcile writes nothing on the pods, so their reports stay as listed
            "annotations": {
                SLOT_ANNOTATION: str(slot),
                POD_DELETION_COST_ANNOTATION: str(-slot),
                ANNOTATION: reports.encode(report),
            },
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


async def peft_config(source: str, revision: str | None, **_: Any) -> dict[str, Any]:
    return {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}


def test_one_reconcile_decodes_each_engine_pods_report_once(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[str | None] = []
    decode = reports.decode

    def counting(text: str | None) -> reports.ReplicaReport | None:
        decoded.append(text)
        return decode(text)

    monkeypatch.setattr(reports, "decode", counting)
    kube = MemoryKube(pool_body(), *(engine_pod_body(slot) for slot in range(N)))
    reconciler = PoolReconciler(kube, peft_config, Settings(render=RenderOptions()))

    asyncio.run(reconciler.reconcile("ml", "p"))

    assert len(decoded) == N
    status = kube.objects[("LoRAPool", "ml", "p")]["status"]
    assert status["plan"]["maxLoras"] >= 1 and status["recommendation"] is not None
