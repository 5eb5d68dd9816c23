"""Locked-down engines: the NetworkPolicy (valid, and which pods it admits, judged over labels),
the engines' API key from a Secret, and routers kept off GPU nodes.

No CNI runs here, so enforcement is not tested in this file: `admits` applies the NetworkPolicy
semantics of the Kubernetes documentation to labels; e2e/kind.sh checks a real CNI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.errors import SpecError
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import names
from lorapool.render.manifests import RenderOptions, render_pool

Obj = dict[str, Any]


def render(doc: Obj) -> list[Obj]:
    pool = parse_object(doc)
    assert isinstance(pool, LoRAPool)
    merged = merge_adapters(pool, [])
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters])
    return render_pool(pool, plan, merged.adapters, RenderOptions(lorapool_image="lorapool:test"))


def kind(objects: list[Obj], kind_: str, name: str) -> Obj:
    return next(o for o in objects if o["kind"] == kind_ and o["metadata"]["name"] == name)


# --- NetworkPolicy semantics over labels (kubernetes.io/docs/concepts/services-networking/network-policies)


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def namespace_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace}


def admits(policies: list[Obj], source: Pod, target: Pod, port: int) -> bool:
    """Whether ingress from ``source`` to ``target:port`` is allowed by these policies (TCP)."""
    governing = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and _selects(p["spec"]["podSelector"], target.labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not governing:
        return True  # a pod no policy selects accepts everything
    for policy in governing:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(p.get("port") == port and p.get("protocol", "TCP") == "TCP" for p in ports):
                continue
            peers = rule.get("from")
            if peers is None or any(_peer(peer, policy["metadata"]["namespace"], source) for peer in peers):
                return True
    return False


def _peer(peer: Obj, policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # we never render one; pods are matched by labels
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None and source.namespace != policy_namespace:
        return False  # a podSelector alone means the policy's own namespace
    if namespaces is not None and not _selects(namespaces, source.namespace_labels):
        return False
    return pods is None or _selects(pods, source.labels)


def policies_for(example_doc: Obj, **security: Any) -> list[Obj]:
    example_doc["spec"]["security"] = security
    return [o for o in render(example_doc) if o["kind"] == "NetworkPolicy"]


ENGINE = Pod("ml", names.labels("llama3-8b", "engine"))
ROUTER = Pod("ml", names.labels("llama3-8b", "router"))
OTHER_ROUTER = Pod("ml", names.labels("mistral", "router"))
ROUTER_LABELS_ELSEWHERE = Pod("attacker", names.labels("llama3-8b", "router"))
NEIGHBOUR = Pod("ml", {"app": "notebook"})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})


@pytest.mark.parametrize(
    ("source", "port", "metrics_namespace", "allowed"),
    [
        (ROUTER, names.ENGINE_PORT, None, True),
        (ROUTER, names.SIDECAR_STATUS_PORT, None, False),
        (OTHER_ROUTER, names.ENGINE_PORT, None, False),
        (ROUTER_LABELS_ELSEWHERE, names.ENGINE_PORT, None, False),
        (ENGINE, names.ENGINE_PORT, None, False),  # sidecars call their own engine on localhost
        (NEIGHBOUR, names.ENGINE_PORT, None, False),
        (NEIGHBOUR, names.SIDECAR_STATUS_PORT, None, False),
        (PROMETHEUS, names.ENGINE_PORT, None, False),
        (PROMETHEUS, names.ENGINE_PORT, "monitoring", True),
        (PROMETHEUS, names.SIDECAR_STATUS_PORT, "monitoring", True),
        (PROMETHEUS, 9999, "monitoring", False),
        (NEIGHBOUR, names.ENGINE_PORT, "monitoring", False),
        (ROUTER, names.ENGINE_PORT, "monitoring", True),
    ],
    ids=[
        "router",
        "router-to-sidecar",
        "other-pools-router",
        "router-labels-in-another-namespace",
        "other-replica",
        "neighbour",
        "neighbour-to-sidecar",
        "scraper-not-configured",
        "scraper-engine-metrics",
        "scraper-sidecar-metrics",
        "scraper-other-port",
        "neighbour-with-scraper",
        "router-with-scraper",
    ],
)
def test_only_the_pools_router_reaches_the_engines(
    example_doc: Obj, source: Pod, port: int, metrics_namespace: str | None, allowed: bool
) -> None:
    security = {"metricsNamespace": metrics_namespace} if metrics_namespace else {}
    policies = policies_for(example_doc, **security)
    assert len(policies) == 1
    assert admits(policies, source, ENGINE, port) is allowed


def test_the_policy_leaves_other_pods_alone(example_doc: Obj) -> None:
    policies = policies_for(example_doc)
    assert admits(policies, NEIGHBOUR, ROUTER, names.ROUTER_PORT)  # clients still reach the router
    assert admits(policies, NEIGHBOUR, Pod("ml", names.labels("mistral", "engine")), names.ENGINE_PORT)


def test_the_sidecar_calls_its_engine_over_localhost(example_doc: Obj) -> None:
    """Why the policy admits no engine pod: the sidecar never leaves its pod to reach vLLM."""
    engine = kind(render(example_doc), "Deployment", "llama3-8b-engine")
    sidecar = engine["spec"]["template"]["spec"]["containers"][1]
    args = sidecar["args"]
    assert args[args.index("--engine") + 1] == f"http://127.0.0.1:{names.ENGINE_PORT}"


def test_network_policy_can_be_turned_off(example_doc: Obj) -> None:
    assert policies_for(example_doc, networkPolicy=False) == []


@pytest.mark.parametrize(
    "security",
    [{}, {"metricsNamespace": "monitoring", "apiKeySecretRef": {"name": "engine-key", "key": "key"}}],
    ids=["default", "scraper-and-key"],
)
def test_security_objects_validate_against_kubernetes_schemas(example_doc: Obj, security: Obj) -> None:
    import kubernetes_validate

    example_doc["spec"]["security"] = security
    for obj in render(example_doc):
        kubernetes_validate.validate(obj, "1.36.0", strict=True)


def test_api_key_comes_from_the_secret_for_engine_router_and_sidecar(example_doc: Obj) -> None:
    example_doc["spec"]["security"] = {"apiKeySecretRef": {"name": "engine-key", "key": "token"}}
    objects = render(example_doc)
    pod = kind(objects, "Deployment", "llama3-8b-engine")["spec"]["template"]["spec"]
    router = kind(objects, "Deployment", "llama3-8b-router")["spec"]["template"]["spec"]
    expected = {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "engine-key", "key": "token"}}}
    for container in [*pod["containers"], *router["containers"]]:
        assert expected in container["env"], container["name"]
    vllm = pod["containers"][0]
    assert "--api-key" not in vllm["args"]  # vLLM reads VLLM_API_KEY; the key never reaches a command line


def test_without_a_key_nothing_is_sent(example_doc: Obj) -> None:
    objects = render(example_doc)
    pod = kind(objects, "Deployment", "llama3-8b-engine")["spec"]["template"]["spec"]
    router = kind(objects, "Deployment", "llama3-8b-router")["spec"]["template"]["spec"]
    for container in [*pod["containers"], *router["containers"]]:
        assert all(e["name"] != "VLLM_API_KEY" for e in container.get("env", [])), container["name"]


def test_api_key_in_extra_args_is_refused_with_the_field_to_use(example_doc: Obj) -> None:
    example_doc["spec"]["vllm"]["extraArgs"] = ["--api-key=hunter2"]
    with pytest.raises(SpecError, match=r"spec\.security\.apiKeySecretRef"):
        parse_object(example_doc)


def _node_admits_preference(preference: Obj, node_labels: dict[str, str]) -> bool:
    return _selects({"matchExpressions": preference["matchExpressions"]}, node_labels)


@pytest.mark.parametrize(
    ("node_labels", "preferred"),
    [
        ({"kubernetes.io/hostname": "cpu-0"}, True),
        ({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}, False),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, False),  # no GFD present label, product only
    ],
    ids=["cpu-node", "gfd-gpu-node", "product-label-only"],
)
def test_router_pods_prefer_nodes_without_gpus(example_doc: Obj, node_labels: dict[str, str], preferred: bool) -> None:
    router = kind(render(example_doc), "Deployment", "llama3-8b-router")["spec"]["template"]["spec"]
    (term,) = router["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in router["affinity"]["nodeAffinity"]
    assert term["weight"] == 100
    assert _node_admits_preference(term["preference"], node_labels) is preferred
    assert "tolerations" not in router  # and no toleration of the GPU taint either
