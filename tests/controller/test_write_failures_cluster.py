"""A write the API server refuses is the pool's WriteFailed condition and one Warning Event, and stops
no LoRAAdapter's status (issue 44). The refusal is the real kube-apiserver's: the adapter-set ConfigMap
is applied over its 1 MiB limit (a ``Kube`` that pads it, as 8,500 adapters did). The reconcile runs
in this process (no operator subprocess), so the test takes seconds."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.controller.index import AdapterIndex
from lorapool.controller.kube import Kube
from lorapool.controller.reconcile import PoolReconciler, Settings
from lorapool.controller.schedule import RetryLater
from lorapool.render import names
from lorapool.render.manifests import RenderOptions
from lorapool_dev.cluster import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

BASE = "meta-llama/Meta-Llama-3-8B-Instruct"


class PaddedKube(Kube):
    """The real API, with the adapter-set ConfigMap padded past 1 MiB while ``pad`` is set; counts writes."""

    pad = True
    writes: Counter[tuple[str, str]]

    def apply(self, obj: dict[str, Any]) -> bool:
        if self.pad and obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == names.adapters_configmap("p"):
            obj = {**obj, "data": {**obj.get("data", {}), "padding": "x" * (1 << 20)}}
        return super().apply(obj)

    def patch_status(self, kind: str, namespace: str, name: str, status: Any) -> None:
        self.writes[kind, "status"] += 1
        super().patch_status(kind, namespace, name, status)


async def config_of(source: str, revision: str | None, **_: Any) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj"],
        "base_model_name_or_path": BASE,
    }


def create(cluster: LocalCluster, *docs: dict[str, Any]) -> None:
    result = cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr


def get(cluster: LocalCluster, kind: str, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(cluster.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout))


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def warnings(cluster: LocalCluster, ns: str) -> list[dict[str, Any]]:
    selector = "involvedObject.kind=LoRAPool,involvedObject.name=p,reason=TooLarge"
    out = cluster.kubectl("get", "events", "-n", ns, "--field-selector", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


def test_an_oversized_configmap_is_a_condition_and_an_event_and_adapters_still_get_their_status(
    local_cluster: LocalCluster, operator_env: Path, admin: Any, ns: str
) -> None:
    pool = {
        "apiVersion": "lorapool.io/v1alpha1",
        "kind": "LoRAPool",
        "metadata": {"name": "p", "namespace": ns},
        "spec": {"baseModel": {"name": BASE, "source": f"hf://{BASE}"}, "gpu": {"product": "A100-80GB"}, "replicas": 1},
    }
    adapters = [
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": f"a{i}", "namespace": ns},
            "spec": {"poolRef": {"name": "p"}, "source": f"hf://acme/a{i}"},
        }
        for i in range(3)
    ]
    create(local_cluster, pool, *adapters)
    kube = PaddedKube(admin)
    kube.writes = Counter()
    reconciler = PoolReconciler(kube, config_of, Settings(render=RenderOptions()), index=AdapterIndex())

    with pytest.raises(RetryLater, match="1 write"):
        asyncio.run(reconciler.reconcile(ns, "p"))
    failed = condition(get(local_cluster, "lorapool", ns, "p"), "WriteFailed")
    assert failed["status"] == "True" and failed["reason"] == "TooLarge", failed
    assert f"apply ConfigMap {names.adapters_configmap('p')}" in failed["message"]
    assert "1048576" in failed["message"] or "too large" in failed["message"].lower()
    for i in range(3):
        assert condition(get(local_cluster, "loraadapter", ns, f"a{i}"), "Accepted")["status"] == "True"
    assert len(warnings(local_cluster, ns)) == 1
    assert kube.writes == Counter({("LoRAAdapter", "status"): 3, ("LoRAPool", "status"): 1})

    # The retry: the same refusal says nothing new (no second Event) and rewrites no adapter.
    with pytest.raises(RetryLater):
        asyncio.run(reconciler.reconcile(ns, "p"))
    assert len(warnings(local_cluster, ns)) == 1
    assert kube.writes[("LoRAAdapter", "status")] == 3

    # An annotate racing a rollout (the pod is gone) is not an error.
    assert kube.annotate("Pod", ns, "p-engine-gone", {names.SLOT_ANNOTATION: "0"}) is False

    # Fixed (the set fits again): the condition goes away.
    kube.pad = False
    asyncio.run(reconciler.reconcile(ns, "p"))
    assert condition(get(local_cluster, "lorapool", ns, "p"), "WriteFailed") == {}
    assert get(local_cluster, "configmap", ns, names.adapters_configmap("p"))["data"].get("padding") is None


@pytest.mark.parametrize("resource_version", [None, "0"])
def test_a_list_reads_every_page_and_keeps_no_managed_fields(
    local_cluster: LocalCluster, admin: Any, ns: str, monkeypatch: pytest.MonkeyPatch, resource_version: str | None
) -> None:
    """Kube.list pages by LIST_PAGE (3 here) across 7 objects, with and without the watch cache's
    resourceVersion=0 (the continue token replaces it: the API server refuses both together)."""
    from lorapool.controller import kube as kube_module

    monkeypatch.setattr(kube_module, "LIST_PAGE", 3)
    maps = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"m{i}", "namespace": ns, "labels": {"t": "l"}}}
        for i in range(7)
    ]
    create(
        local_cluster, *maps, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": ns}}
    )
    kube, pages = Kube(admin), []
    call = kube._call
    monkeypatch.setattr(kube, "_call", lambda *a, **k: pages.append(k.get("query")) or call(*a, **k))
    listed = kube.list("ConfigMap", ns, "t=l", resource_version)
    assert sorted(o["metadata"]["name"] for o in listed) == [f"m{i}" for i in range(7)]
    if resource_version is None:  # from etcd: 3 + 3 + 1 (the watch cache may answer "0" in one page)
        assert len(pages) == 3, pages
    assert all("managedFields" not in o["metadata"] for o in listed)
