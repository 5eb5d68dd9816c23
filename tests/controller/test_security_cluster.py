"""Locked-down engines in a real control plane: the operator applies the pool's NetworkPolicy
(owned by the pool) and the router pods land on a node without GPUs. NetworkPolicy enforcement
needs a CNI, which only e2e/kind.sh has; tests/render/test_security.py judges what it admits."""

from __future__ import annotations

from pathlib import Path

import pytest

from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess
from tests.controller.test_operator import adapter_dir, apply, get, node_of, pool_doc, ready

pytestmark = pytest.mark.cluster


def test_operator_applies_the_network_policy_and_spreads_routers_from_the_gpu_free_node(
    local_cluster: LocalCluster, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    doc = pool_doc(ns, "locked", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1)
    doc["spec"]["router"] = {"replicas": 2}
    doc["spec"]["security"] = {"metricsNamespace": "monitoring"}
    apply(local_cluster, doc)
    pool = wait_until("pool Ready", lambda: ready(local_cluster, ns, "locked"), 90)

    policy = get(local_cluster, "networkpolicy", ns, "locked-engine")
    assert policy is not None
    (owner,) = policy["metadata"]["ownerReferences"]
    assert owner["uid"] == pool["metadata"]["uid"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"
    assert len(policy["spec"]["ingress"]) == 2  # the router, and the scraper namespace

    # Ready needs one ready router pod, not both: wait for both to be scheduled before reading their nodes.
    routers = wait_until(
        "both router pods scheduled",
        lambda: (
            (nodes := node_of(local_cluster, ns, "app.kubernetes.io/component=router"))
            and len(nodes) == 2
            and all(nodes)
            and nodes
        ),
        60,
        describe=lambda: node_of(local_cluster, ns, "app.kubernetes.io/component=router"),
    )
    # The one node without GPUs first; the second router on another node (docs/high-availability.md:
    # spreading over nodes outweighs the GPU-free preference when one node has no GPU).
    assert "cpu-0" in routers and len(set(routers)) == 2, routers
