"""The gateway door in a real control plane: the InferencePool CRD absent, then installed while the
operator runs; a gateway's verdict in InferencePoolReady; a door change prunes what it no longer
renders; and the real API server judges the InferencePool we render by GIE's v1 schema and CEL
rules (lorapool_dev.testing.inferencepool_crd)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lorapool.api.load import parse_object
from lorapool.api.models import LoRAPool
from lorapool.plan.adapters import merge_adapters
from lorapool.plan.planner import AdapterRank, plan_pool
from lorapool.render import names
from lorapool.render.manifests import render_pool
from lorapool_dev.cluster import LocalCluster
from lorapool_dev.testing.wait import wait_until
from tests.controller.conftest import OperatorProcess, install_inferencepool_crd
from tests.controller.test_operator import adapter_dir, apply, condition, get, pool_doc, ready

pytestmark = pytest.mark.cluster

GATEWAY = {"namespace": "envoy-gateway-system"}


def door_condition(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    pool = get(cluster, "lorapool", ns, name)
    current = pool and (pool.get("status") or {}).get("observedGeneration") == pool["metadata"]["generation"]
    return condition(pool, "InferencePoolReady") if current else {}


def wait_reason(cluster: LocalCluster, ns: str, name: str, reason: str, timeout_s: float = 90) -> dict[str, Any]:
    got: dict[str, Any] = wait_until(
        f"InferencePoolReady reason {reason}",
        lambda: (c := door_condition(cluster, ns, name)).get("reason") == reason and c,
        timeout_s,
        describe=lambda: door_condition(cluster, ns, name),
    )
    return got


def report_parent(cluster: LocalCluster, ns: str, name: str, status: str, reason: str) -> None:
    """Write status.parents as a gateway's controller does for a Gateway whose HTTPRoute names the pool."""
    parent = {
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gw", "namespace": ns},
        "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
        "conditions": [
            {
                "type": "Accepted",
                "status": status,
                "reason": reason,
                "message": "" if status == "True" else "the HTTPRoute was refused",
                "lastTransitionTime": "2026-12-04T00:00:00Z",
            }
        ],
    }
    patch = json.dumps({"status": {"parents": [parent]}})
    cluster.kubectl("patch", "inferencepool", name, "-n", ns, "--subresource=status", "--type=merge", "-p", patch)


def test_the_inference_pool_follows_its_crd_and_the_gateways_verdict(
    local_cluster: LocalCluster, no_inferencepool_crd: None, operator: OperatorProcess, ns: str, tmp_path: Path
) -> None:
    doc = pool_doc(ns, "door", [{"name": "a", "source": adapter_dir(tmp_path, "a", 8)}], replicas=1)
    doc["spec"]["router"] = {"frontDoor": "both", "gateway": GATEWAY}
    apply(local_cluster, doc)

    # No CRD: a clear condition, and everything else is applied and serving.
    missing = wait_reason(local_cluster, ns, "door", "InferencePoolCRDMissing")
    assert missing["status"] == "False" and "install the Gateway API Inference Extension CRDs" in missing["message"]
    pool = wait_until("pool Ready without the CRD", lambda: ready(local_cluster, ns, "door"), 90)
    assert pool["status"]["inferencePool"] == f"{ns}/door"
    assert get(local_cluster, "service", ns, names.endpoint_picker("door")) is not None
    assert get(local_cluster, "service", ns, names.router_service("door")) is not None

    # The CRD appears: the running operator applies the InferencePool, no restart.
    install_inferencepool_crd(local_cluster)
    wait_reason(local_cluster, ns, "door", "NoParent", timeout_s=120)
    infpool = get(local_cluster, "inferencepool", ns, "door")
    assert infpool is not None and infpool["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    assert operator.proc.poll() is None

    # A gateway's verdict, as its controller writes it.
    report_parent(local_cluster, ns, "door", "False", "HTTPRouteNotAccepted")
    refused = wait_reason(local_cluster, ns, "door", "NotAccepted")
    assert "Gateway" in refused["message"] and "HTTPRouteNotAccepted" in refused["message"]
    report_parent(local_cluster, ns, "door", "True", "Accepted")
    accepted = wait_reason(local_cluster, ns, "door", "Accepted")
    assert accepted["status"] == "True" and "inference-gw" in accepted["message"]

    # Back to the router door: what only the gateway door rendered is gone, the router Service stays.
    doc["spec"]["router"] = {"frontDoor": "router"}
    apply(local_cluster, doc)
    wait_until(
        "the gateway door's objects deleted",
        lambda: (
            get(local_cluster, "inferencepool", ns, "door") is None
            and get(local_cluster, "service", ns, names.endpoint_picker("door")) is None
            and get(local_cluster, "networkpolicy", ns, names.router_network_policy("door")) is None
        ),
        90,
    )
    pool = wait_until("pool Ready on the router door", lambda: ready(local_cluster, ns, "door"), 90)
    assert "inferencePool" not in pool["status"]
    assert not condition(pool, "InferencePoolReady")
    assert get(local_cluster, "service", ns, names.router_service("door")) is not None


def rendered_inference_pool(ns: str) -> dict[str, Any]:
    doc = pool_doc(ns, "judged", [{"name": "a", "source": "hf://acme/a", "rank": 8}], replicas=1)
    doc["spec"]["router"] = {"frontDoor": "gateway", "gateway": GATEWAY}
    pool = parse_object(doc)
    assert isinstance(pool, LoRAPool)
    merged = merge_adapters(pool, [])
    plan = plan_pool(pool.spec, [AdapterRank(a.spec.name, a.field, a.spec.rank) for a in merged.adapters])
    return next(o for o in render_pool(pool, plan, merged.adapters) if o["kind"] == "InferencePool")


def dry_run(cluster: LocalCluster, obj: dict[str, Any]) -> tuple[int, str]:
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump(obj), check=False)
    return result.returncode, result.stderr


def mutated(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


REFUSED = {
    "duplicate-target-port": (
        ("spec", "targetPorts"),
        [{"number": 8000}, {"number": 8000}],
        "port number must be unique",
    ),
    "nine-target-ports": (
        ("spec", "targetPorts"),
        [{"number": 8000 + i} for i in range(9)],
        "must have at most 8 items",
    ),
    "service-without-port": (("spec", "endpointPickerRef", "port"), None, "port is required when kind is 'Service'"),
    "failure-mode": (("spec", "endpointPickerRef", "failureMode"), "Sometimes", 'Unsupported value: "Sometimes"'),
    "app-protocol": (("spec", "appProtocol"), "grpc", 'Unsupported value: "grpc"'),
    "empty-selector": (("spec", "selector", "matchLabels"), {}, "should have at least 1 properties"),
    "port-zero": (("spec", "targetPorts"), [{"number": 0}], "should be greater than or equal to 1"),
}


@pytest.fixture
def inferencepool_crd_installed(local_cluster: LocalCluster, no_inferencepool_crd: None) -> None:
    install_inferencepool_crd(local_cluster)


def test_the_api_server_accepts_the_rendered_inference_pool_and_refuses_what_gie_refuses(
    local_cluster: LocalCluster, inferencepool_crd_installed: None, ns: str
) -> None:
    rendered = rendered_inference_pool(ns)
    code, err = dry_run(local_cluster, rendered)
    assert code == 0, err
    for case, (path, value, message) in REFUSED.items():
        code, err = dry_run(local_cluster, mutated(rendered, path, value))
        assert code != 0 and message in err, (case, err)


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ({}, "router.frontDoor gateway or both with security.networkPolicy on needs router.gateway.namespace"),
        ({"cidrs": ["10.0.0.1/8"]}, "must be an IP block in CIDR notation"),
        ({"namespace": "gw", "cidrs": ["not-a-block"]}, "must be an IP block in CIDR notation"),
    ],
    ids=["no-gateway-peers", "host-bits-set", "not-a-cidr"],
)
def test_the_api_server_refuses_a_gateway_door_it_cannot_secure(
    local_cluster: LocalCluster, operator_env: Path, ns: str, gateway: dict[str, Any], message: str
) -> None:
    doc = pool_doc(ns, "refused", [], replicas=1)
    doc["spec"]["router"] = {"frontDoor": "gateway", "gateway": gateway}
    result = apply(local_cluster, doc, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr
