"""A GitOps bulk apply against the real control plane: a pool and 200 LoRAAdapters in one
``kubectl apply`` reach ONE engine pod template (issue 44 item 2; before, one per catalogue seen).

The pool waits ``spec.lora.replan.settleSeconds`` (3 s here, to keep the test to seconds) after the
last adapter change before it renders its first engine template. Asserted on what the API server
keeps: the engine Deployment's generation (every spec change bumps it) and its ReplicaSets (one per
pod template the controller-manager saw). Cost: ~15-25 s on the 2-core machine, most of it the
201 creates of the apply.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.controller import replan
from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import adapter_dir, condition, get, pool_doc, pool_event_reasons

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

ADAPTERS, SETTLE_S = 200, 3


def _bulk(ns: str, source: str) -> dict[str, Any]:
    pool = pool_doc(ns, "bulk", [], replicas=1)
    pool["spec"]["lora"]["replan"] = {"settleSeconds": SETTLE_S}
    adapters = [
        {
            "apiVersion": "lorapool.io/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": f"team-{i:03d}", "namespace": ns},
            "spec": {"poolRef": {"name": "bulk"}, "source": source},
        }
        for i in range(ADAPTERS)
    ]
    return {"apiVersion": "v1", "kind": "List", "items": [pool, *adapters]}


def test_a_bulk_apply_gives_one_engine_pod_template(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    doc = _bulk(ns, adapter_dir(tmp_path, "shared", 16))
    local_cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc), timeout_s=120)

    def settled() -> dict[str, Any] | None:
        pool = get(local_cluster, "lorapool", ns, "bulk") or {}
        status = pool.get("status") or {}
        restart = condition(pool, replan.CONDITION)
        engine = get(local_cluster, "deployment", ns, names.engine("bulk"))
        done = status.get("adapterCount") == ADAPTERS and restart.get("status") == "False" and engine is not None
        return {"pool": pool, "engine": engine} if done else None

    seen = wait_until("pool planned for all adapters, no restart pending", settled, 90, interval_s=0.5)
    plan, engine = seen["pool"]["status"]["plan"], seen["engine"]
    flags = replan.engine_flags(engine)
    assert flags == replan.Flags(plan["maxLoras"], plan["maxLoraRank"], plan["maxCpuLoras"])
    assert plan["maxLoras"] > 8  # planned for the whole catalogue, not the first adapters seen
    assert engine["metadata"]["generation"] == 1  # one engine spec ever applied
    selector = names.selector_string("bulk", "engine")
    wait_until(
        "the engine's ReplicaSet",
        lambda: json.loads(local_cluster.kubectl("get", "rs", "-n", ns, "-l", selector, "-o", "json").stdout)["items"],
        30,
        interval_s=0.5,
    )
    sets = json.loads(local_cluster.kubectl("get", "rs", "-n", ns, "-l", selector, "-o", "json").stdout)["items"]
    assert len(sets) == 1, [s["metadata"]["name"] for s in sets]
    router = get(local_cluster, "deployment", ns, names.router("bulk"))
    assert router is not None and router["metadata"]["generation"] == 1
    assert replan.CONDITION in pool_event_reasons(local_cluster, ns, "bulk")  # the first template's wait, announced
