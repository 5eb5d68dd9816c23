"""k-of-N placement on the local control plane (docs/placement.md): the operator gives each engine
pod a slot, the ConfigMap lists each adapter's slots, each pod's sidecar loads exactly its share
(local sim + sidecar per pod, reporting on the real Pod), status shows placed and loaded replicas;
a rolling update moves nothing, a scale-up moves ~1/N, a scale-down removes the top slot."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lorapool.plan.placement import moves
from lorapool.render import names
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.fakekubelet import LocalEngines
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import BASE, adapter_dir, apply, get, pool_doc, ready

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

POOL = "placed"
ADAPTERS = [f"team-{i}" for i in range(6)]


def doc(ns: str, tmp_path: Path, **spec: Any) -> dict[str, Any]:
    adapters = [{"name": n, "source": adapter_dir(tmp_path, n, 8)} for n in ADAPTERS]
    body = {"replicas": 3, "lora": {"maxLoras": 2, "maxLoraRank": "auto", "maxCpuLoras": 3}, **spec}
    return pool_doc(ns, POOL, adapters, **body)


def live_pods(cluster: LocalCluster, ns: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", names.selector_string(POOL, "engine"), "-o", "json").stdout
    return [p for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def slots(cluster: LocalCluster, ns: str) -> dict[str, str]:
    """Live engine pod -> its slot annotation ('' while unassigned)."""
    return {
        p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(names.SLOT_ANNOTATION, "")
        for p in live_pods(cluster, ns)
    }


def holders(cluster: LocalCluster, ns: str) -> dict[str, tuple[str, ...]]:
    """Adapter -> the slots the ConfigMap places it on."""
    cm = get(cluster, "configmap", ns, names.adapters_configmap(POOL)) or {}
    listed = json.loads((cm.get("data") or {}).get("adapters.json", '{"adapters": []}'))["adapters"]
    return {a["name"]: tuple(str(s) for s in a["replicas"]) for a in listed if "replicas" in a}


def held(engines: LocalEngines, pod: str) -> set[str]:
    replica = engines.replicas.get(pod)
    if replica is None:
        return set()
    cards = json.loads(urllib.request.urlopen(f"{replica.sim.url}/v1/models", timeout=5).read())["data"]
    return {c["id"] for c in cards if c.get("parent")}


def shares_held(cluster: LocalCluster, ns: str, engines: LocalEngines, n: int) -> dict[str, set[str]] | None:
    """Slot -> what its pod's engine holds, once n pods have slots 0..n-1 and each holds exactly its share."""
    by_slot = {s: pod for pod, s in slots(cluster, ns).items() if s}
    if sorted(by_slot) != [str(i) for i in range(n)]:
        return None
    placement = holders(cluster, ns)
    out = {}
    for slot, pod in by_slot.items():
        want = {a for a, h in placement.items() if slot in h}
        got = held(engines, pod)
        if got != want:
            return None
        out[slot] = got
    return out


def pool_adapters(cluster: LocalCluster, ns: str) -> dict[str, dict[str, Any]]:
    pool = get(cluster, "lorapool", ns, POOL) or {}
    return {a["name"]: a for a in (pool.get("status") or {}).get("adapters") or []}


@pytest.fixture
def engines(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path, admin: Any
) -> Iterator[LocalEngines]:
    apply(local_cluster, doc(ns, tmp_path))
    wait_until("3 engine pods", lambda: len(live_pods(local_cluster, ns)) == 3, 60)
    token = local_cluster.service_account_kubeconfig(ns, f"{POOL}-engine", path=tmp_path / "engine-sa.kubeconfig")
    sim = {"served_model_name": BASE, "max_loras": 2, "max_lora_rank": 8, "max_cpu_loras": 3, "time_scale": 0}
    with LocalEngines(admin, ns, POOL, tmp_path / "engines", sim_flags=sim, report_kubeconfig=token).start() as e:
        yield e


def test_each_replica_loads_its_share_and_placement_survives_rollouts_and_scaling(
    local_cluster: LocalCluster, ns: str, tmp_path: Path, engines: LocalEngines
) -> None:
    # 1. Six adapters exceed one replica's CPU cache (maxCpuLoras 3): k of N, k=1 with no load.
    got = wait_until("each replica holds exactly its share", lambda: shares_held(local_cluster, ns, engines, 3), 120)
    assert set().union(*got.values()) == set(ADAPTERS) and sum(map(len, got.values())) == len(ADAPTERS)
    assert max(map(len, got.values())) <= 3  # never more than a replica's maxCpuLoras
    for pod in live_pods(local_cluster, ns):
        a = pod["metadata"]["annotations"]
        assert a[names.POD_DELETION_COST_ANNOTATION] == str(-int(a[names.SLOT_ANNOTATION]))

    def placed_and_loaded() -> dict[str, dict[str, Any]] | None:
        status = pool_adapters(local_cluster, ns)
        ok = all(
            status.get(n, {}).get("placedReplicas") == 1
            and status[n].get("loadedReplicas") == 1
            and status[n].get("phase") == "Ready"
            for n in ADAPTERS
        )
        return status if ok and ready(local_cluster, ns, POOL) else None

    wait_until("status: every adapter placed on 1 replica, loaded on 1, Ready", placed_and_loaded, 60)
    pool = get(local_cluster, "lorapool", ns, POOL) or {}
    assert pool["status"]["placement"]["mode"] == "KOfN" and pool["status"]["placement"]["capacity"] == 3

    # 2. A rolling update (new vLLM flags) replaces every pod: the replacements take the freed slots,
    #    and the placement does not move.
    before, old_pods = holders(local_cluster, ns), set(slots(local_cluster, ns))
    apply(local_cluster, doc(ns, tmp_path, vllm={"maxModelLen": 8192, "gpuMemoryUtilization": 0.9, "maxNumSeqs": 128}))

    def rolled() -> dict[str, set[str]] | None:
        pods = set(slots(local_cluster, ns))
        return shares_held(local_cluster, ns, engines, 3) if pods and not pods & old_pods else None

    wait_until("every pod replaced, each holding its slot's share", rolled, 180)
    assert holders(local_cluster, ns) == before
    assert moves(before, holders(local_cluster, ns)) == 0

    # 3. Scale up by one: slot 3 appears and takes ~1/4 of the copies; nothing else moves.
    three = slots(local_cluster, ns)
    apply(local_cluster, doc(ns, tmp_path, replicas=4, vllm={"maxModelLen": 8192, "gpuMemoryUtilization": 0.9,
                                                              "maxNumSeqs": 128}))  # fmt: skip
    wait_until("4 replicas holding their shares", lambda: shares_held(local_cluster, ns, engines, 4), 120)
    after = holders(local_cluster, ns)
    moved = moves(before, after)
    assert 0 < moved <= 3, (before, after)  # 6 copies over 4 slots: the new slot's share, not a reshuffle
    assert all(set(after[a]) - {"3"} <= set(before[a]) for a in ADAPTERS)  # copies only moved to the new slot

    # 4. Scale back down: the deletion cost removes the pod in slot 3; the others keep their slots.
    apply(local_cluster, doc(ns, tmp_path, replicas=3, vllm={"maxModelLen": 8192, "gpuMemoryUtilization": 0.9,
                                                              "maxNumSeqs": 128}))  # fmt: skip
    wait_until("back to the three original pods", lambda: slots(local_cluster, ns) == three or None, 60)
    wait_until("3 replicas holding their shares", lambda: shares_held(local_cluster, ns, engines, 3), 120)
    assert holders(local_cluster, ns) == before
