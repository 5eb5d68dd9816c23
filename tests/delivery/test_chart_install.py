"""`helm install`, `helm upgrade` and `helm uninstall` of the chart with the real helm CLI into
the local control plane. KWOK runs no containers, so the operator pods never run code here;
what this shows is that every object is accepted (the admission policy included), scheduled and
reported Available, that an upgrade rolls cleanly, and that an uninstall leaves only the CRDs (as
Helm does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from lorapool_dev.cluster import LocalCluster
from tests.delivery.helm import CHART, helm

pytestmark = pytest.mark.cluster

RELEASE, NAMESPACE = "lp-lifecycle", "lp-lifecycle"
OPERATOR = "lp-lifecycle-lorapool-operator"


def manifest_objects(cluster: LocalCluster) -> list[tuple[str, str | None, str]]:
    """(kind, namespace, name) of everything the release installed, from `helm get manifest`."""
    out = helm("get", "manifest", RELEASE, "-n", NAMESPACE, kubeconfig=cluster.kubeconfig).stdout
    return [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in yaml.safe_load_all(out) if d]


def exists(cluster: LocalCluster, kind: str, namespace: str | None, name: str) -> bool:
    ns = ["-n", namespace] if namespace else []
    return cluster.kubectl("get", kind, name, *ns, "-o", "name", check=False).returncode == 0


def deployment(cluster: LocalCluster) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "deployment", OPERATOR, "-n", NAMESPACE, "-o", "json").stdout)


@pytest.fixture
def uninstalled_at_the_end(local_cluster: LocalCluster) -> Iterator[None]:
    """The chart's admission policy (on by default) refuses report writes with tokens not bound to
    their Pod, which the other tests of the session use: when the test fails before its own
    uninstall, the release still goes before the next test runs."""
    yield
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s",
         kubeconfig=local_cluster.kubeconfig, check=False)  # fmt: skip


@pytest.mark.usefixtures("uninstalled_at_the_end")
def test_install_upgrade_uninstall(local_cluster: LocalCluster) -> None:
    kubeconfig = local_cluster.kubeconfig
    installed = helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "120s",
        kubeconfig=kubeconfig,
    )
    assert "STATUS: deployed" in installed.stdout
    notes = installed.stdout.split("NOTES:", 1)[1]
    assert "kind: LoRAPool" in notes and "kubectl wait --for=condition=Ready lp/llama3-8b" in notes
    example = "\n".join(
        line[2:] for line in notes.split("Save this as lorapool.yaml:\n\n", 1)[1].split("\n\n")[0].splitlines()
    )
    # The example in the notes is accepted by the API server as it is (CRD schema and CEL rules).
    local_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input_text=example)

    objects = manifest_objects(local_cluster)
    kinds = {kind for kind, _, _ in objects}
    assert {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    } <= kinds
    for kind, namespace, name in objects:
        assert exists(local_cluster, kind, namespace, name), f"{kind} {namespace}/{name} not created"
    for crd in ("lorapools.lorapool.io", "loraadapters.lorapool.io"):
        assert exists(local_cluster, "crd", None, crd)

    local_cluster.kubectl(
        "wait", "--for=condition=Available", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--timeout=60s"
    )
    status = deployment(local_cluster)["status"]
    assert status["readyReplicas"] == 2 and status["availableReplicas"] == 2
    pods = json.loads(
        local_cluster.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator", "-o", "json"
        ).stdout
    )["items"]
    nodes = [p["spec"]["nodeName"] for p in pods]
    assert len(nodes) == 2 and len(set(nodes)) == 2, f"pod anti-affinity should spread the replicas: {nodes}"

    upgraded = helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--wait",
        "--timeout",
        "120s",
        "--set",
        "replicaCount=3",
        "--set",
        "resources.requests.cpu=200m",
        "--set",
        "resources.limits.memory=768Mi",
        kubeconfig=kubeconfig,
    )
    assert "STATUS: deployed" in upgraded.stdout and "REVISION: 2" in upgraded.stdout
    local_cluster.kubectl("rollout", "status", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--timeout=60s")
    live = deployment(local_cluster)
    (container,) = live["spec"]["template"]["spec"]["containers"]
    assert live["spec"]["replicas"] == 3 and live["status"]["readyReplicas"] == 3
    assert container["resources"] == {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "768Mi"}}
    history = json.loads(helm("history", RELEASE, "-n", NAMESPACE, "-o", "json", kubeconfig=kubeconfig).stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]

    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s", kubeconfig=kubeconfig)
    left = [(k, ns, n) for k, ns, n in objects if exists(local_cluster, k, ns, n)]
    assert not left, f"helm uninstall left {left}"
    for crd in ("lorapools.lorapool.io", "loraadapters.lorapool.io"):
        assert exists(local_cluster, "crd", None, crd), "Helm never deletes CRDs: pools must survive an uninstall"
    local_cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
