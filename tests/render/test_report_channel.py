"""The pods' side of the report channels (docs/status.md, docs/placement.md): a token for the sidecar only,
the narrowest Role that lets it report, the readiness gate, and the router's right to write its counts."""

from __future__ import annotations

from typing import Any

from lorapool.api.report import SYNCED_CONDITION
from lorapool.render import names
from tests.render.test_render import by_kind, render


def test_only_the_sidecar_gets_a_token_and_it_may_only_patch_pod_status_and_read_its_set(
    example_doc: dict[str, Any],
) -> None:
    objects = render(example_doc)
    sa = names.engine_service_account("llama3-8b")
    pod = by_kind(objects, "Deployment", "llama3-8b-engine")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa and pod["automountServiceAccountToken"] is False
    assert by_kind(objects, "ServiceAccount", sa)["automountServiceAccountToken"] is False
    (volume,) = [v for v in pod["volumes"] if "projected" in v]
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["expirationSeconds"] <= 3600
    mounts = {c["name"]: [m["name"] for m in c["volumeMounts"]] for c in pod["containers"]}
    assert volume["name"] in mounts["adapter-sync"] and volume["name"] not in mounts["vllm"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "adapter-sync")
    token_mount = next(m for m in sidecar["volumeMounts"] if m["name"] == volume["name"])
    assert token_mount["mountPath"] == names.SERVICE_ACCOUNT_MOUNT and token_mount["readOnly"] is True
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in sidecar["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    shards = [f"llama3-8b-adapters-{i}" for i in range(32)]
    assert by_kind(objects, "Role", sa)["rules"] == [
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["llama3-8b-adapters", *shards],
            "verbs": ["get", "list", "watch"],
        },
    ]
    binding = by_kind(objects, "RoleBinding", sa)
    assert binding["roleRef"]["name"] == sa and binding["subjects"][0]["name"] == sa


def test_engine_pods_wait_for_their_first_adapter_sync(example_doc: dict[str, Any]) -> None:
    objects = render(example_doc)
    pod = by_kind(objects, "Deployment", "llama3-8b-engine")["spec"]["template"]["spec"]
    assert pod["readinessGates"] == [{"conditionType": SYNCED_CONDITION}]
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ServiceAccount") < kinds.index("Deployment")  # pods are refused without their account


def test_each_router_pod_knows_itself_and_may_only_read_pods_and_patch_pod_status(example_doc: dict[str, Any]) -> None:
    """The router writes its request counts on its own Pod (lorapool.io/requests): the downward API names
    the Pod, and its Role adds exactly ``patch`` on ``pods/status`` to what routing reads (the slices,
    the pods' reports, and the pool's adapter set by name, as the sidecars read it)."""
    objects = render(example_doc)
    router = names.router("llama3-8b")
    (container,) = by_kind(objects, "Deployment", router)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    rules = by_kind(objects, "Role", router)["rules"]
    assert rules == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [names.adapters_configmap("llama3-8b"), *names.adapter_shards("llama3-8b")],
            "verbs": ["get", "list", "watch"],
        },
    ]
    engine_rules = by_kind(objects, "Role", names.engine_service_account("llama3-8b"))["rules"]
    assert rules[-1] in engine_rules  # the same rule the sidecars read the set by
